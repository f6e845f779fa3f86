"""Persistence: the broker's state across restarts.

Owns start-up recovery (index snapshot + journal tail), taking snapshots while running
(capture, checkpoint), replay's compact live slots, anchored memo tables and the state-part
extension point other packages use to ride in the journal and snapshot. May import routing,
paging, streams and storage.
"""
