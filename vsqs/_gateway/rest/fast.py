"""The native face's hot routes answered past FastAPI's layers:
:class:`NativeFastPath`, an ASGI middleware just inside the gateway's own
(every check of those, the API key and the caps included, has run when a
request gets here).

FastAPI's per-request work (its inner middleware, the scan of every route,
dependency solving, a validation per parameter) cost about as much CPU as a
raw publish or receive itself. For the routes of :data:`FAST_ROUTES` this
middleware does the part of that work they need, from the routes' own
declarations: it picks the route as FastAPI's router would (the first route
whose path and method match), validates the path and query parameters with
a pydantic model made of the route's own parameter declarations (the same
types and constraints, one source), calls the route's function with the
route's body caps (:func:`~vsqs._gateway.rest.bodies.call_bounded`) and
answers errors with the app's own exception handlers. Anything else goes to
FastAPI unchanged: another route, and any request whose parameters do not
validate (FastAPI answers those, with its messages), so the fast path never
has an answer of its own to keep in step.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError, create_model
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from vsqs._gateway.asgi import Receive, Scope, Send
from vsqs._gateway.rest.bodies import call_bounded

# the native routes a client calls once per message (by the route's name)
FAST_ROUTES = frozenset({"publish_raw", "receive_raw", "delete"})
_PREFIX = "/queues/"  # every native route is under it

Handler = Callable[[Request, Exception], Awaitable[Response]]


class _FastRoute:
    """One route of :data:`FAST_ROUTES`: its parameters' model, made of its own declarations."""

    def __init__(self, route: APIRoute) -> None:
        dependant = route.dependant
        unsupported = (dependant.header_params or dependant.cookie_params or dependant.body_params
                       or dependant.dependencies or dependant.response_param_name
                       or dependant.background_tasks_param_name or dependant.websocket_param_name)
        if unsupported or dependant.request_param_name is None or route.response_model is not None:
            raise TypeError(f"route {route.name!r} takes more than path and query parameters and the request, "
                            "or answers a model: the fast path cannot answer it")
        if not inspect.iscoroutinefunction(route.endpoint):  # (FastAPI would call it on its thread pool)
            raise TypeError(f"route {route.name!r} is not an async function: the fast path cannot call it")
        self.route = route
        self.request_name = dependant.request_param_name
        # the names clients send (a field's alias, its name unless declared otherwise), by which FastAPI
        # reads each parameter and the model below validates it
        self.path_aliases = [field.alias for field in dependant.path_params]
        self.query_aliases = [field.alias for field in dependant.query_params]
        declared: dict[str, Any] = {field.name: (field.field_info.annotation, field.field_info)
                                    for field in [*dependant.path_params, *dependant.query_params]}
        self.parameters: type[BaseModel] = create_model(f"{route.name}_parameters", **declared)

    def arguments(self, path_params: Mapping[str, str], query_string: bytes) -> dict[str, Any] | None:
        """The route function's parameters, validated; None if any is invalid (FastAPI answers that)."""
        raw: dict[str, Any] = {alias: path_params[alias] for alias in self.path_aliases}
        if query_string:
            query = QueryParams(query_string)
            for alias in self.query_aliases:
                value = query.get(alias)
                if value is not None:
                    raw[alias] = value
        try:
            return dict(self.parameters.model_validate(raw))  # (by the functions' own names)
        except ValidationError:
            return None


class NativeFastPath:
    """Answers the requests of :data:`FAST_ROUTES` itself (see the module's
    docstring); passes every other request to ``app``, the FastAPI app."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._by_method: dict[str, list[tuple[Route, _FastRoute | None]]] = {}
        routes = list(app.router.routes)
        methods = {method for route in routes if isinstance(route, Route) for method in route.methods or ()}
        for method in methods:
            # the routes FastAPI's router would try for a request of this method, in its order: a route
            # of another method never answers it; any other kind of route stops the fast path there
            candidates: list[tuple[Route, _FastRoute | None]] = []
            for route in routes:
                if not isinstance(route, Route):
                    break
                if route.methods is None or method in route.methods:  # (None: every method)
                    fast = _FastRoute(route) if isinstance(route, APIRoute) and route.name in FAST_ROUTES else None
                    candidates.append((route, fast))
            self._by_method[method] = candidates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path") and scope["path"].startswith(_PREFIX):
            chosen = self._choose(scope)
            if chosen is not None:
                await self._answer(chosen[0], chosen[1], scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _choose(self, scope: Scope) -> tuple[_FastRoute, dict[str, Any]] | None:
        """The fast route FastAPI's router would pick, and its arguments; None: FastAPI's to answer."""
        path = scope["path"]
        for route, fast in self._by_method.get(scope["method"], ()):
            match = route.path_regex.match(path)
            if match is None:
                continue
            if fast is None:
                return None
            path_params = {key: route.param_convertors[key].convert(value) for key, value in match.groupdict().items()}
            arguments = fast.arguments(path_params, scope["query_string"])
            if arguments is None:
                return None
            scope.update(app=self.app, router=self.app.router, endpoint=route.endpoint,
                         path_params={**scope.get("path_params", {}), **path_params}, route=route)
            return fast, arguments
        return None

    async def _answer(self, fast: _FastRoute, arguments: dict[str, Any], scope: Scope, receive: Receive,
                      send: Send) -> None:
        """The route function's answer, or the app's handler's answer to its error."""
        request = Request(scope, receive, send)
        endpoint = fast.route.endpoint

        async def handler(bounded: Request) -> Response:
            answer: Response = await endpoint(**{fast.request_name: bounded}, **arguments)
            return answer

        try:
            response = await call_bounded(handler, request, fast.route.name)
        except Exception as exc:  # noqa: BLE001 - answered as FastAPI's layers answer it, or raised
            response = await self._error_answer(exc, request, send)
        await response(scope, receive, send)

    async def _error_answer(self, exc: Exception, request: Request, send: Send) -> Response:
        """The answer to ``exc`` as FastAPI's layers make it: the app's handler of
        it (found as starlette finds it), tried by the route's exception layer
        and then, for that handler's own error, by the app's. An error neither
        answers: the server-error answer is sent and the error raised (for the
        server to log), as the app's ServerErrorMiddleware does."""
        handlers = cast(Mapping[Any, Handler], self.app.exception_handlers)
        try:
            for _layer in ("route", "app"):
                error_handler = _handler_of(handlers, exc)
                if error_handler is None:
                    break
                try:
                    answer: Response = await error_handler(request, exc)
                    return answer
                except Exception as error:  # noqa: BLE001 - the next layer's to answer
                    exc = error
            raise exc
        except Exception as error:
            await _answer_server_error(handlers, error, request, send)
            raise


def _handler_of(handlers: Mapping[Any, Handler], exc: Exception) -> Handler | None:
    """The app's handler of ``exc``, looked up as starlette's ExceptionMiddleware
    does (by status, then by class; those of 500 and Exception are not its)."""
    if isinstance(exc, StarletteHTTPException) and exc.status_code != 500 and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls is Exception:
            break
        if cls in handlers:
            return handlers[cls]
    return None


async def _answer_server_error(handlers: Mapping[Any, Handler], exc: Exception, request: Request,
                               send: Send) -> None:
    """The answer to an error nothing else answers: the app's handler of 500 or
    Exception (starlette's ServerErrorMiddleware's), else a plain 500."""
    server_handler = None
    for key, handler in handlers.items():
        if key in (500, Exception):
            server_handler = handler  # (the last one, as starlette picks it)
    answer = (PlainTextResponse("Internal Server Error", status_code=500) if server_handler is None
              else await server_handler(request, exc))
    await answer(request.scope, request.receive, send)
