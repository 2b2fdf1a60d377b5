"""The Query protocol's names (vsqs/_gateway/sqs/query_shapes.py) against the
authority: the SQS service model of botocore 1.34.89, the last one that
speaks Query (installed as tests/gateway/query_client.py says)."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from tests.gateway.query_client import model_path
from vsqs._gateway.sqs import query_shapes as _shapes
from vsqs._gateway.sqs.actions import ACTIONS

# members the gateway takes beyond the Query model (documented in query_shapes): action -> names
EXTRA_INPUTS = {"ReceiveMessage": {"MessageSystemAttributeNames"}}
_KINDS = {"string": "string", "blob": "string", "integer": "integer", "long": "integer", "boolean": "boolean"}
# the first test to run installs the Query clients (pip, npm): minutes on a loaded machine
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    with gzip.open(model_path(), "rt", encoding="utf-8") as f:
        loaded: dict[str, Any] = json.load(f)
    assert loaded["metadata"]["protocol"] == "query"
    assert loaded["metadata"]["xmlNamespace"] == _shapes.XML_NAMESPACE
    return loaded


def _from_model(model: dict[str, Any], name: str) -> Any:
    """A model shape described as :func:`_described` describes ours."""
    shape = model["shapes"][name]
    kind = shape["type"]
    if kind == "structure":
        members = {}
        for member_name, ref in shape["members"].items():
            target = model["shapes"][ref["shape"]]
            if target["type"] == "list":
                assert ref.get("flattened") or target.get("flattened"), (name, member_name)
                wire = target["member"].get("locationName") or ref.get("locationName") or member_name
            else:
                if target["type"] == "map":
                    assert ref.get("flattened") or target.get("flattened"), (name, member_name)
                wire = ref.get("locationName") or target.get("locationName") or member_name
            members[member_name] = (wire, _from_model(model, ref["shape"]))
        return ("struct", members)
    if kind == "list":
        return ("list", _from_model(model, shape["member"]["shape"]))
    if kind == "map":
        return ("map", shape["key"].get("locationName", "key"), shape["value"].get("locationName", "value"),
                _from_model(model, shape["value"]["shape"]))
    return _KINDS[kind]


def _described(shape: _shapes.Shape, leave_out: frozenset[str] = frozenset()) -> Any:
    if isinstance(shape, _shapes.Struct):
        return ("struct", {m.name: (m.wire, _described(m.shape)) for m in shape.members if m.name not in leave_out})
    if isinstance(shape, _shapes.ListOf):
        return ("list", _described(shape.item))
    if isinstance(shape, _shapes.MapOf):
        return ("map", shape.key, shape.value, _described(shape.item))
    return shape.kind


def test_every_action_has_its_query_shapes(model: dict[str, Any]) -> None:
    assert set(_shapes.INPUTS) == set(model["operations"]) == set(ACTIONS)
    answering = {name for name, op in model["operations"].items() if "output" in op}
    assert set(_shapes.OUTPUTS) == answering


@pytest.mark.parametrize("action", sorted(_shapes.INPUTS))
def test_parameters_are_named_as_the_model_names_them(model: dict[str, Any], action: str) -> None:
    expected = _from_model(model, model["operations"][action]["input"]["shape"])
    ours = _described(_shapes.INPUTS[action], frozenset(EXTRA_INPUTS.get(action, ())))
    assert ours == expected


@pytest.mark.parametrize("action", sorted(_shapes.OUTPUTS))
def test_answers_are_named_as_the_model_names_them(model: dict[str, Any], action: str) -> None:
    output = model["operations"][action]["output"]
    assert output["resultWrapper"] == f"{action}Result"
    assert _described(_shapes.OUTPUTS[action]) == _from_model(model, output["shape"])
