"""Request shapes several test modules send: a function tool, the Hermes call of it a model
writes, and a response format."""

from __future__ import annotations

import pydantic

#: A chat function tool (``tools`` of a chat request).
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

#: The same tool as Anthropic's Messages API takes it (``tools`` of ``/v1/messages``).
CLAUDE_WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": WEATHER["function"]["parameters"],
}

#: A call of :data:`WEATHER` as a Hermes-format model writes it.
CALL = '<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>'


class City(pydantic.BaseModel):
    """A ``response_format`` (the SDK's parse helpers turn it into a JSON schema)."""

    name: str
    population: int
