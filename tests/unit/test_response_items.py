"""The Responses output items (``gateway.serving.responses.items``) in the shapes of the
pinned openai-python's types: every field the SDK's model has and no other, optional
fields left out when unset, and the SDK reads each back to the same values."""

from __future__ import annotations

from typing import Any

import pytest
from openai import BaseModel as SdkModel
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

from gateway.serving.responses.items import (
    FunctionCallItem,
    MessageItem,
    OutputItem,
    ReasoningItem,
    dump,
)
from gateway.serving.responses.tools import ToolNames

LOGPROB = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}


def _sdk_keys(model: type[SdkModel], data: dict[str, Any]) -> set[str]:
    """The keys of ``data`` the SDK's model has no field for."""
    return set(data) - set(model.model_fields)


CASES: list[tuple[OutputItem, type[SdkModel]]] = [
    (MessageItem.done("msg_1", "Hi", "completed", [LOGPROB]), ResponseOutputMessage),
    (MessageItem.done("msg_2", "cut", "incomplete"), ResponseOutputMessage),
    (MessageItem.opened("msg_3"), ResponseOutputMessage),
    (ReasoningItem.done("rs_1", "think", "sealed-token"), ResponseReasoningItem),
    (ReasoningItem.done("rs_2", "think"), ResponseReasoningItem),
    (ReasoningItem.opened("rs_3"), ResponseReasoningItem),
    (
        FunctionCallItem.called("fc_1", "call_1", "f", '{"a": 1}', "completed"),
        ResponseFunctionToolCall,
    ),
]


@pytest.mark.parametrize(("item", "sdk_type"), CASES)
def test_an_item_is_what_the_sdk_reads(item: OutputItem, sdk_type: type[SdkModel]) -> None:
    data = dump(item)
    assert _sdk_keys(sdk_type, data) == set()
    parsed = sdk_type.model_validate(data)
    assert parsed.to_dict(mode="json") == data


def test_optional_fields_are_left_out_unless_set() -> None:
    assert "encrypted_content" not in dump(ReasoningItem.done("rs", "think"))
    assert dump(ReasoningItem.done("rs", "t", "x"))["encrypted_content"] == "x"
    plain = dump(FunctionCallItem.called("fc", "c", "lookup", "{}", "completed"))
    assert "namespace" not in plain and plain["name"] == "lookup"


def test_a_namespaced_call_reports_its_name_and_namespace() -> None:
    names = ToolNames(namespaced={"crm__lookup": ("crm", "lookup")})
    item = FunctionCallItem.called("fc", "c", "crm__lookup", "{}", "in_progress", names)
    data = dump(item)
    assert (data["name"], data["namespace"]) == ("lookup", "crm")
    assert ResponseFunctionToolCall.model_validate(data).namespace == "crm"


def test_an_opened_item_has_no_content_yet_and_a_done_one_has_its_one_part() -> None:
    assert dump(MessageItem.opened("m"))["content"] == []
    (part,) = dump(MessageItem.done("m", "Hello", "completed"))["content"]
    assert part == {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    (reasoning,) = dump(ReasoningItem.done("r", "because"))["content"]
    assert reasoning == {"type": "reasoning_text", "text": "because"}
