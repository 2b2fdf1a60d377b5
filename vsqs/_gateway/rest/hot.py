"""The native face's hot routes, the ones a client calls once per message
(:data:`HOT_ROUTES`), as plain starlette routes: :class:`HotRoute`, put first
in the app's router by :func:`hot_routes`.

FastAPI's per-request work for a route (dependency solving, a validation per
parameter, its request and response layers) cost about as much CPU as a raw
publish or receive itself. Each hot route is still declared once, as a
FastAPI route of :mod:`.routes`: its path parameters as annotated types, its
query parameters as one pydantic model (``Annotated[Model, Query()]``), from
which FastAPI writes the OpenAPI schema. Its :class:`HotRoute` validates the
same declarations with pydantic, calls the same function with the route's
body caps (:func:`~vsqs._gateway.rest.bodies.call_bounded`), and raises
invalid parameters as FastAPI's :class:`~fastapi.exceptions.RequestValidationError`,
which the app's handler answers as for any route. The FastAPI route stays in
the router behind it, for the schema, and answers the same way when
:data:`HOT_ROUTES` is emptied (``scripts/gateway_instructions.py
--no-fast-path`` weighs the difference).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable
from typing import Any

from fastapi import params
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route

from vsqs._gateway.asgi import Receive, Scope, Send
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
