"""The JSON admin API under /api/: what the console's pages and `sluice admin` call.

Every mutating call answers only after what it journaled is durable (fsync'd), so "moved"
means moved on disk too. Errors are JSON ``{"error": "..."}`` with 400, 404, 409 or 500.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sluicemq.admin import operations as ops
from sluicemq.admin import snapshot
from sluicemq.admin.snapshot import NotFound
from sluicemq.protocol.numbers import MAX_DIGITS, natural, shown

if TYPE_CHECKING:
    from sluicemq.admin.context import AdminContext
    from sluicemq.core.routing.broker import Broker

CTX: web.AppKey[AdminContext] = web.AppKey("admin_context")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def reply(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json",
                        headers=headers)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map admin exceptions to statuses, so handlers read as the happy path."""
    try:
        return await handler(request)
    except NotFound as exc:
        return reply({"error": str(exc)}, 404)
    except ops.Conflict as exc:
        return reply({"error": str(exc)}, 409)
    except ops.OperationError as exc:
        return reply({"error": str(exc)}, 400)


async def wait_durable(broker: Broker) -> None:
    """Resolve once everything appended so far is on disk; a journal failure raises."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def callback(exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    broker.when_durable(callback)
    try:
        await done
    except Exception as exc:
        raise web.HTTPInternalServerError(
            text=json.dumps({"error": f"not stored: {exc}"}), content_type="application/json",
        ) from None


def _ctx(request: web.Request) -> AdminContext:
    return request.app[CTX]


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        data = await request.json()
    except (ValueError, UnicodeDecodeError, RecursionError):
        # (ValueError: a JSONDecodeError, or an integer past 4,300 digits; RecursionError:
        # arrays nested thousands deep)
        raise ops.OperationError("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ops.OperationError("request body must be a JSON object")
    return data


def _ids(data: dict[str, Any]) -> list[int] | None:
    """Message ids as ints; ``ID:sluice-N`` strings (what consumers see) are accepted too."""
    raw = data.get("ids")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ops.OperationError("'ids' must be a list of message ids")
    out = []
    for item in raw:
        mid = natural(str(item).removeprefix("ID:sluice-"))
        if mid is None:
            raise ops.OperationError(f"bad message id {shown(str(item))}")
        out.append(mid)
    return out


def _int_query(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    value = natural(raw)
    if value is None:
        raise ops.OperationError(f"query parameter {name!r} must be a non-negative integer "
                                 f"of at most {MAX_DIGITS} digits, got {shown(raw)}")
    return value


# -- read ----------------------------------------------------------------------------------------
async def get_overview(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    return reply(snapshot.overview(ctx.broker, ctx.store, ctx.sessions(), ctx.sampler))


async def get_rates(request: web.Request) -> web.Response:
    seconds = _int_query(request, "seconds", 300)
    points = _ctx(request).sampler.series(seconds)
    return reply({"points": [{"t": p.t, "in": p.msgs_in, "out": p.msgs_out} for p in points]})


async def get_users(request: web.Request) -> web.Response:
    """Each login's share of the store (``[limits] user_store_limit``)."""
    return reply(snapshot.user_shares_view(_ctx(request).broker))


async def get_destinations(request: web.Request) -> web.Response:
    return reply({"destinations": snapshot.destinations(_ctx(request).broker)})


async def get_destination(request: web.Request) -> web.Response:
    m = request.match_info
    return reply(snapshot.destination_detail(_ctx(request).broker, m["kind"], m["name"]))


async def get_messages(request: web.Request) -> web.Response:
    q = snapshot.find_queue(_ctx(request).broker, request.match_info["name"])
    return reply(snapshot.browse(q, _int_query(request, "offset", 0),
                                 _int_query(request, "limit", 50)))


async def get_message(request: web.Request) -> web.StreamResponse:
    """One waiting message; ``?raw=1`` returns its body bytes as they would be delivered."""
    q = snapshot.find_queue(_ctx(request).broker, request.match_info["name"])
    mid = natural(request.match_info["mid"].removeprefix("ID:sluice-"))
    if mid is None:
        raise NotFound(f"bad message id {shown(request.match_info['mid'])}")
    msg = snapshot.find_message(q, mid)
    broker = _ctx(request).broker
    body = bytes(broker.body_of(msg))
    if request.query.get("raw"):
        # The producer chose the content type: a download, never a page of the console's
        # origin (text/html would be stored XSS against whoever looks at the message).
        ctype = msg.headers.get("content-type", "application/octet-stream")
        return web.Response(body=body, headers={
            "Content-Type": ctype if _plain_type(ctype) else "application/octet-stream",
            "Content-Disposition": f'attachment; filename="message-{msg.mid}.bin"',
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "X-Content-Type-Options": "nosniff"})
    return reply(snapshot.message_view(msg, preview=64 << 10, body=body))


def _plain_type(ctype: str) -> bool:
    """A content type fit for a header: one line of printable ASCII."""
    return ctype.isascii() and ctype.isprintable() and len(ctype) <= 200


async def get_connections(request: web.Request) -> web.Response:
    conns = _ctx(request).connections()
    return reply({"connections": [snapshot.connection_view(s, t) for s, t in conns]})


async def get_streams(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    table = getattr(ctx.broker, "streams", None)
    return reply({"available": table is not None,
                  "streams": snapshot.streams(ctx.broker, ctx.stream_rates)})


# -- act -----------------------------------------------------------------------------------------
async def purge(request: web.Request) -> web.Response:
    ctx, m = _ctx(request), request.match_info
    removed = ops.purge(ctx.broker, m["kind"], m["name"])
    await wait_durable(ctx.broker)
    return reply({"removed": removed})


async def delete_destination(request: web.Request) -> web.Response:
    ctx, m = _ctx(request), request.match_info
    dropped = ops.delete(ctx.broker, m["kind"], m["name"])
    await wait_durable(ctx.broker)
    return reply({"deleted": f"/{m['kind']}/{m['name']}", "dropped": dropped})


async def delete_message(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    q = snapshot.find_queue(ctx.broker, request.match_info["name"])
    mid = _ids({"ids": [request.match_info["mid"]]}) or []
    removed = ops.remove_messages(q, mid)
    await wait_durable(ctx.broker)
    return reply({"removed": removed})


async def _transfer(request: web.Request, *, copy: bool) -> web.Response:
    ctx = _ctx(request)
    data = await _json_body(request)
    target = data.get("to")
    if not isinstance(target, str) or not target:
        raise ops.OperationError("'to' (the target destination) is required")
    ops.parse_target(target)
    q = snapshot.find_queue(ctx.broker, request.match_info["name"])
    count = ops.transfer(ctx.broker, q, target, _ids(data), copy=copy)
    await wait_durable(ctx.broker)
    return reply({"copied" if copy else "moved": count, "to": ops.parse_target(target)[1]})


async def move(request: web.Request) -> web.Response:
    return await _transfer(request, copy=False)


async def copy(request: web.Request) -> web.Response:
    return await _transfer(request, copy=True)


async def retry(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    data = await _json_body(request)
    by_origin = ops.retry_dead_letters(ctx.broker, request.match_info["name"], _ids(data))
    await wait_durable(ctx.broker)
    return reply({"retried": sum(by_origin.values()), "origins": by_origin})


async def send(request: web.Request) -> web.Response:
    ctx, m = _ctx(request), request.match_info
    data = await _json_body(request)
    if "body_base64" in data:
        try:
            body = base64.b64decode(str(data["body_base64"]), validate=True)
        except (binascii.Error, ValueError):
            raise ops.OperationError("'body_base64' is not valid base64") from None
    else:
        body = str(data.get("body", "")).encode()
    headers = data.get("headers") or {}
    if not isinstance(headers, dict):
        raise ops.OperationError("'headers' must be an object of strings")
    msg = ops.send(ctx.broker, f"/{m['kind']}/{m['name']}", body, headers,
                   persistent=bool(data.get("persistent", True)))
    await wait_durable(ctx.broker)
    return reply({"id": msg.message_id, "mid": msg.mid, "destination": msg.destination}, 201)


async def close_connection(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    return reply(ops.close_connection(ctx.sessions(), request.match_info["id"]))


async def get_health(request: web.Request) -> web.Response:
    """Master or standby, since when, and who holds the data directory's lock."""
    ha = _ctx(request).ha
    if ha is None:  # a broker assembled without the lock (tests, embedding)
        return reply({"status": "ok", "role": "master", "since": None, "lock": None})
    return reply(ha.health())


def add_routes(app: web.Application) -> None:
    dest = "/api/destinations/{kind:queue|topic}/{name}"
    queue = "/api/destinations/queue/{name}"
    app.router.add_get("/api/health", get_health)
    app.router.add_get("/api/overview", get_overview)
    app.router.add_get("/api/rates", get_rates)
    app.router.add_get("/api/destinations", get_destinations)
    app.router.add_get(dest, get_destination)
    app.router.add_delete(dest, delete_destination)
    app.router.add_post(dest + "/purge", purge)
    app.router.add_post(dest + "/send", send)
    app.router.add_get(queue + "/messages", get_messages)
    app.router.add_get(queue + "/messages/{mid}", get_message)
    app.router.add_delete(queue + "/messages/{mid}", delete_message)
    app.router.add_post(queue + "/move", move)
    app.router.add_post(queue + "/copy", copy)
    app.router.add_post(queue + "/retry", retry)
    app.router.add_get("/api/connections", get_connections)
    app.router.add_get("/api/users", get_users)
    app.router.add_delete("/api/connections/{id}", close_connection)
    app.router.add_get("/api/streams", get_streams)
