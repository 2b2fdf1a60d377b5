"""The native face's hot routes, the ones a client calls once per message
(:data:`HOT_ROUTES`), as plain starlette routes: :class:`HotRoute`, made by
:func:`hot_routes`, answered by :class:`HotDispatch` before FastAPI's stack.

FastAPI's per-request work for a route (dependency solving, a validation per
parameter, its request and response layers) cost about as much CPU as a raw
publish or receive itself. Each hot route is still declared once, as a
FastAPI route of :mod:`.routes`: its path parameters as annotated types, its
query parameters as one pydantic model (``Annotated[Model, Query()]``), from
which FastAPI writes the OpenAPI schema. Its :class:`HotRoute` validates the
same declarations with pydantic, calls the same function with the route's
body caps (:func:`~vsqs._gateway.rest.bodies.call_bounded`), and raises
invalid parameters as FastAPI's :class:`~fastapi.exceptions.RequestValidationError`,
which the app's handler answers as for any route.

FastAPI's stack in front of its router (its telemetry, server-error,
body-limit, exception and exit-stack layers) cost the hot routes more than
their own routing: :class:`HotDispatch`, plain ASGI composition just inside
the gateway's own middleware, sends a request that fully matches a hot route
to it, and every other request to the FastAPI app; a hot route's error is
answered by the two layers of that stack that answer errors (starlette's
``ServerErrorMiddleware`` and ``ExceptionMiddleware``, with the FastAPI app's
own handlers, split as FastAPI splits them), put together for that error
only. The hot routes are also first in the app's router, where they
answer what the dispatch leaves to it for their paths (a method they do not
take: 405), as they did alone; the FastAPI route stays behind them, for the
schema, and answers the same way when :data:`HOT_ROUTES` is emptied
(``scripts/gateway_instructions.py --no-fast-path`` weighs the difference).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import FastAPI, params
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route

from vsqs._gateway.asgi import ASGIApp, Receive, Scope, Send
from vsqs._gateway.rest.bodies import call_bounded

# the native routes a client calls once per message, by the route's name
HOT_ROUTES = frozenset({"publish_raw", "receive_raw", "delete"})


class HotRoute(Route):
    """The starlette route of one documented FastAPI route (see the module's
    docstring). Like FastAPI's routes it names itself in the scope (metrics
    count requests by route name), and it takes only its own method: no
    implicit HEAD, which for a raw receive would take a message."""

    def __init__(self, documented: Route) -> None:
        if not documented.methods or len(documented.methods) != 1:
            raise TypeError(f"route {documented.name!r} must take one method to be a hot route")
        (method,) = documented.methods
        super().__init__(documented.path, _Endpoint(self), methods=[method], name=documented.name)
        self.methods = {method}
        self.function = documented.endpoint
        self._request_name, self._path_types, self._options = _parameters_of(self.function, set(self.param_convertors))
        self._option_names = tuple(self._options[1].model_fields) if self._options else ()

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope

    async def answer(self, request: Request) -> Response:
        """The function's answer to ``request`` (its errors raised, for the app's handlers)."""
        arguments = self._arguments(request)

        async def call(bounded: Request) -> Response:
            answer: Response = await self.function(**{self._request_name: bounded}, **arguments)
            return answer

        return await call_bounded(call, request, self.name)

    def _arguments(self, request: Request) -> dict[str, Any]:
        """The function's path parameters and options, validated as FastAPI
        would (path first, then query; the errors with FastAPI's locations)."""
        arguments: dict[str, Any] = {}
        errors: list[Any] = []
        path_params = request.path_params
        for name, adapter in self._path_types.items():
            try:
                arguments[name] = adapter.validate_python(path_params[name])
            except ValidationError as exc:
                errors += [{**error, "loc": ("path", name, *error["loc"])} for error in exc.errors()]
        if self._options is not None:
            name, model = self._options
            given: dict[str, str] = {}
            if request.scope["query_string"]:
                query = request.query_params
                given = {option: query[option] for option in self._option_names if option in query}
            try:
                arguments[name] = model.model_validate(given)
            except ValidationError as exc:
                errors += [{**error, "loc": ("query", *error["loc"])} for error in exc.errors()]
        if errors:
            raise RequestValidationError(errors)
        return arguments


class _Endpoint:
    """A :class:`HotRoute`'s ASGI app. starlette calls a function endpoint through
    a layer of its own that catches errors for the app's handlers; the app's
    exception middleware, around every route, calls the same handlers, so
    errors are simply raised to it."""

    def __init__(self, route: HotRoute) -> None:
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.route.answer(Request(scope, receive))
        await response(scope, receive, send)


class HotDispatch:
    """Answers a request that fully matches one of ``routes`` (the :class:`HotRoute`
    s, also first in ``app``'s router) by that route; passes every other request
    to ``app``. The scope gets what FastAPI's stack would have put in it for the
    route: the app, its router, the route's path parameters and the route itself.

    An error raised while the route makes its answer (nothing has been sent yet)
    is answered by the two layers of FastAPI's stack that answer errors,
    starlette's ``ExceptionMiddleware`` inside its ``ServerErrorMiddleware``,
    given ``app``'s own handlers as FastAPI gives them: the same handler, the
    same answer, and an error no handler answers raised after the 500, for the
    server to log. The layers are put together for that error only (around an
    app that raises it), so an answered request does not pay for them; an
    error while the answer is sent, after its start, is raised as is, as those
    layers would raise it (they cannot answer any more)."""

    def __init__(self, app: FastAPI, routes: Sequence[HotRoute]) -> None:
        self.app = app
        # by method: a route of another method never fully matches a request (the router's 405 is FastAPI's)
        self._by_method: dict[str, tuple[HotRoute, ...]] = {}
        for route in routes:
            for method in route.methods or ():
                self._by_method[method] = (*self._by_method.get(method, ()), route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self._by_method.get(scope["method"], ()):
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    scope["app"] = self.app
                    scope.setdefault("router", self.app.router)
                    try:
                        response = await route.answer(Request(scope, receive))
                    except Exception as exc:  # noqa: BLE001 - answered by starlette's layers, or raised by them
                        await self._error_layers(exc)(scope, receive, send)
                        return
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _error_layers(self, exc: Exception) -> ASGIApp:
        """An app that raises ``exc`` inside the two layers of FastAPI's stack that
        answer errors, given ``app``'s handlers as FastAPI gives them (those of
        500 and ``Exception`` to the server-error layer, the others to the
        exception layer)."""

        async def raise_it(scope: Scope, receive: Receive, send: Send) -> None:
            raise exc

        server_error_handler = None
        handlers = {}
        for key, handler in self.app.exception_handlers.items():
            if key in (500, Exception):
                server_error_handler = handler
            else:
                handlers[key] = handler
        debug = self.app.debug
        return ServerErrorMiddleware(ExceptionMiddleware(raise_it, handlers=handlers, debug=debug),
                                     handler=server_error_handler, debug=debug)


def hot_routes(routes: Iterable[BaseRoute]) -> list[HotRoute]:
    """The :class:`HotRoute` of each route of ``routes`` named in :data:`HOT_ROUTES`, in their order."""
    return [HotRoute(route) for route in routes if isinstance(route, Route) and route.name in HOT_ROUTES]


def _parameters_of(function: Any, path_names: set[str]) -> tuple[str, dict[str, TypeAdapter[Any]],
                                                                  tuple[str, type[BaseModel]] | None]:
    """What a hot route's function takes, from its own annotations: the request's
    parameter, the path parameters' types, and the one model of its query
    parameters (name and class). Anything else (a body, a dependency, a
    function FastAPI would run on a thread) is refused, at start."""
    name = getattr(function, "__name__", repr(function))
    if not inspect.iscoroutinefunction(function):
        raise TypeError(f"route {name!r} is not an async function: a hot route awaits it")
    hints = typing.get_type_hints(function, include_extras=True)
    request_name = None
    path_types: dict[str, TypeAdapter[Any]] = {}
    options: tuple[str, type[BaseModel]] | None = None
    for parameter in inspect.signature(function).parameters:
        hint: Any = hints.get(parameter)
        base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
        if hint is Request or (isinstance(hint, type) and issubclass(hint, Request)):
            request_name = parameter
        elif parameter in path_names:
            path_types[parameter] = TypeAdapter(hint)
        elif options is None and _is_query_model(hint, base):
            options = (parameter, base)
        else:
            raise TypeError(f"route {name!r} takes {parameter!r}, which a hot route cannot give "
                            "(it gives the request, path parameters and one model of query parameters)")
    if request_name is None:
        raise TypeError(f"route {name!r} does not take the request: a hot route gives it its body")
    return request_name, path_types, options


def _is_query_model(hint: Any, base: Any) -> bool:
    """``Annotated[Model, Query()]``: a model of query parameters (a bare model is a body)."""
    markers = getattr(hint, "__metadata__", ())
    return (isinstance(base, type) and issubclass(base, BaseModel)
            and any(isinstance(marker, params.Query) for marker in markers))
