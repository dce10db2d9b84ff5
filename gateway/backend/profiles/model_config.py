"""A model's Triton config as the gateway reads it, and request tensors built from it.

Requests are built from what the model declares, never from a fixed list: only declared
inputs are sent, each with its declared dtype, and with a leading batch dimension when the
model batches (``max_batch_size > 0``). Numbers are range-checked before they are cast, so a
value the tensor cannot hold (a negative seed for a UINT64 input, a ``max_tokens`` beyond
INT32) is the client's 400, not a wrapped-around value or a Triton error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.backend import grpc_streams as streams
from gateway.errors import InvalidRequestError

#: Config data types (``TYPE_*``) -> Triton's wire names.
_WIRE = {"TYPE_STRING": "BYTES"}

_INTEGER: dict[str, type[np.integer[Any]]] = {
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
}
_FLOAT: dict[str, type[np.floating[Any]]] = {
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model's config."""

    name: str
    datatype: str
    """Triton's wire name: ``BYTES``, ``BOOL``, ``INT32``, ``FP32``, ..."""
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """What the gateway reads from a model's ``config.pbtxt`` (Triton's JSON form)."""

    name: str
    backend: str = ""
    platform: str = ""
    max_batch_size: int = 0
    decoupled: bool = False
    inputs: dict[str, TensorSpec] = field(default_factory=dict)
    outputs: dict[str, TensorSpec] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    steps: tuple[str, ...] = ()
    """An ensemble's step models, in order."""

    @classmethod
    def from_json(cls, name: str, config: dict[str, Any]) -> ModelConfig:
        def specs(key: str) -> dict[str, TensorSpec]:
            found = {}
            for entry in config.get(key, []):
                kind = str(entry.get("data_type", ""))
                spec = TensorSpec(
                    name=str(entry.get("name", "")),
                    datatype=_WIRE.get(kind, kind.removeprefix("TYPE_")),
                    dims=tuple(int(d) for d in entry.get("dims", [])),
                    optional=bool(entry.get("optional", False)),
                )
                found[spec.name] = spec
            return found

        steps = config.get("ensemble_scheduling", {}).get("step", [])
        return cls(
            name=name,
            backend=str(config.get("backend", "")),
            platform=str(config.get("platform", "")),
            max_batch_size=int(config.get("max_batch_size") or 0),
            decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
            inputs=specs("input"),
            outputs=specs("output"),
            parameters={
                k: str(v.get("string_value", "")) for k, v in config.get("parameters", {}).items()
            },
            steps=tuple(str(s.get("model_name", "")) for s in steps),
        )

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def names(self, key: str) -> tuple[str, ...]:
        """A comma-separated parameter as a tuple (empty when absent)."""
        return tuple(v.strip() for v in self.parameters.get(key, "").split(",") if v.strip())

    def integer(self, key: str) -> int | None:
        value = self.parameters.get(key, "").strip()
        return int(value) if value.isdigit() else None

    def tensor(self, name: str, values: Any, param: str | None = None) -> streams.Input:
        """The declared input ``name`` holding ``values`` (one value, or a sequence for a
        ``-1`` dimension), in its dtype and shape. ``param`` names the OpenAI parameter in
        the 400 a value out of the tensor's range gets."""
        return encode(self.inputs[name], values, 1 if self.batched else 0, param)

    def rows(self, name: str, values: list[Any]) -> streams.Input:
        """The input ``name`` of a batched model holding one row per value (a batch of
        ``len(values)`` items in one request)."""
        return encode(self.inputs[name], values, len(values))

    def tensors(self, values: dict[str, Any]) -> list[streams.Input]:
        """Every entry of ``values`` (input name -> value) the model declares."""
        return [self.tensor(n, v) for n, v in values.items() if n in self.inputs]


def _shape(spec: TensorSpec, count: int, batch: int) -> list[int]:
    """The request shape of ``count`` values: the declared dims with ``-1`` filled, after a
    batch dimension of ``batch`` rows (0: the model does not batch)."""
    per_row = count // batch if batch else count
    dims = list(spec.dims) or [1]
    if -1 in dims:
        fixed = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = max(per_row // max(fixed, 1), 0)
        dims = [1 if d == -1 else d for d in dims]
    elif math.prod(dims) != per_row:
        dims = [per_row]  # a config that declares [1] but a list was mapped to it
    return [batch, *dims] if batch else dims


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def encode(
    spec: TensorSpec, values: Any, batch: int = 0, param: str | None = None
) -> streams.Input:
    """A request tensor for ``spec``: BYTES from str/bytes, numbers range-checked."""
    kind = spec.datatype
    if isinstance(values, np.ndarray) and kind in _FLOAT:  # audio: no per-sample Python
        flat = np.ascontiguousarray(values.reshape(-1), dtype=_FLOAT[kind])
        return streams.tensor(spec.name, kind, _shape(spec, flat.size, batch), flat.tobytes())
    items: Sequence[Any] = list(values) if isinstance(values, list | tuple) else [values]
    shape = _shape(spec, len(items), batch)
    if kind == "BYTES":
        # Numbers mapped to a BYTES input travel as their text (bytes(5) would be 5 zeros).
        data = [
            v if isinstance(v, bytes) else (v if isinstance(v, str) else _text(v)).encode()
            for v in items
        ]
        return streams.texts(spec.name, data, shape)
    if kind == "BOOL":
        return streams.tensor(spec.name, kind, shape, bytes(1 if v else 0 for v in items))
    if kind in _INTEGER:
        dtype = _INTEGER[kind]
        limits = np.iinfo(dtype)
        for value in items:
            number = int(value)
            if not limits.min <= number <= limits.max:
                raise InvalidRequestError(
                    f"{param or spec.name} is {number}, but the model takes values from "
                    f"{limits.min} to {limits.max} (its '{spec.name}' input is {kind}).",
                    param=param or spec.name,
                )
        array = np.array([int(v) for v in items], dtype=dtype)
    elif kind in _FLOAT:
        limit = float(np.finfo(_FLOAT[kind]).max)
        for value in items:
            if not math.isfinite(float(value)) or abs(float(value)) > limit:
                raise InvalidRequestError(
                    f"{param or spec.name} is {value}, which the model's '{spec.name}' input "
                    f"({kind}) cannot hold.",
                    param=param or spec.name,
                )
        array = np.asarray(items, dtype=_FLOAT[kind])
    else:
        raise InvalidRequestError(
            f"The model's '{spec.name}' input is {kind}, which the gateway cannot fill.",
            param=param or spec.name,
        )
    return streams.tensor(spec.name, kind, shape, array.tobytes())
