"""The web console: pages, the JSON API and /metrics on one aiohttp server in the broker's loop.

When the broker has users (``[security]``), every console request needs HTTP basic credentials
of a user with broker-wide ``admin`` rights (an ACL rule on ``>``). An open broker has an open
console, so it listens where ``--host`` says — loopback by default. Either way the console
refuses what a hostile web page in the operator's browser could send: requests whose Host is
not a loopback name while bound to loopback (DNS rebinding), cross-origin writes, and writes
that are not JSON (which browsers cannot send cross-site without a preflight this server never
approves). Every response carries ``X-Content-Type-Options: nosniff``, a Content-Security-Policy
and ``X-Frame-Options: DENY``, so nothing a producer put in a message (``?raw=1`` bodies are
attachments under a sandboxing policy) can run script in the console's origin.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from sluicemq.admin import api
from sluicemq.admin.context import AdminContext
from sluicemq.admin.metrics import CONTENT_TYPE, make_registry, render
from sluicemq.core.security.origin import cross_site, host_refused, is_loopback
from sluicemq.core.security.policy import ADMIN, Security

STATIC = Path(__file__).parent / "static"
PAGES = {
    "/": "overview.html",
    "/destinations": "destinations.html",
    "/destination": "destination.html",
    "/streams": "streams.html",
    "/connections": "connections.html",
}
# The console's pages load their script, styles and data from the console itself, nothing else.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                    "Referrer-Policy": "same-origin", "Content-Security-Policy": CSP}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def make_guard(loopback_only: bool) -> Middleware:
    """Middleware: the browser-borne attacks a credential-less console must not fall for."""

    @web.middleware
    async def guard(request: web.Request, handler: api.Handler) -> web.StreamResponse:
        if host_refused(request.host, loopback_only):
            return api.reply({"error": "the console answers only to a loopback Host name"}, 403)
        if request.method not in SAFE_METHODS:
            why = cross_site(request.headers, request.host)
            if why:
                return api.reply({"error": f"cross-origin request refused: {why}"}, 403)
            if request.method == "POST" and request.content_type != "application/json":
                return api.reply({"error": "POST bodies must be application/json"}, 415)
        return await handler(request)

    return guard


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every response, errors and static files included (a handler may be stricter)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)





def make_auth(security: Security | None) -> Middleware:
    """Middleware: basic credentials of a broker-wide admin, once the broker has users."""

    @web.middleware
    async def auth(request: web.Request, handler: api.Handler) -> web.StreamResponse:
        if security is None or not security.enabled:
            return await handler(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        address = f"{peer[0]}:{peer[1]}" if peer else "?"
        user, reason = await security.authenticate_basic(request.headers.get("Authorization"),
                                                         address)
        if reason:
            await asyncio.sleep(security.settings.login_failure_delay)
        if reason or (user is None and not security.authorize(None, ADMIN, None)):
            return api.reply({"error": reason or "authentication required"}, 401,
                             headers={"WWW-Authenticate": 'Basic realm="SluiceMQ console"'})
        if not security.authorize(user, ADMIN, None):
            name = user.name if user else "anonymous"
            return api.reply({"error": f"{name} has no broker-wide admin rights"}, 403)
        return await handler(request)

    return auth


def make_app(ctx: AdminContext, *, loopback_only: bool = True,
             security: Security | None = None) -> web.Application:
    app = web.Application(middlewares=[make_guard(loopback_only), make_auth(security),
                                       api.errors_as_json])
    app[api.CTX] = ctx
    app.on_response_prepare.append(_security_headers)
    api.add_routes(app)
    registry = make_registry(ctx)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=render(registry), headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/metrics", metrics)
    for path, filename in PAGES.items():
        app.router.add_get(path, _page(STATIC / filename))
    app.router.add_static("/static/", STATIC)
    return app


def _page(path: Path) -> api.Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    return handler


class AdminConsole:
    """Owns the console's aiohttp server; the app samples ``ctx`` once a second meanwhile."""

    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx
        self._runner: web.AppRunner | None = None

    async def serve(self, host: str, sockets: list[socket.socket]) -> None:
        """Serve on ``sockets``, already listening on ``host`` (``transport/deferred.py``)."""
        app = make_app(self.ctx, loopback_only=is_loopback(host),
                       security=self.ctx.security)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        for sock in sockets:
            await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
