"""The `sluice` command line: one module per command family, assembled in ``main``.

Each family module defines its click commands and nothing registers itself; ``main.build_cli``
puts them in the ``sluice`` group. The top layer: may import any other package.
"""
