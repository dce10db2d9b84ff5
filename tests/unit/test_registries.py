"""The registries as tables: the order profiles are tried in, and tables that hold every
profile and parser the packages define (a module added without its table entry fails here).

The order is checked on the configs of ``triton_repo/`` (the stand-ins reproduce the
backends' own configs), each read as Triton hands it to the gateway."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from gateway.backend import profiles
from gateway.backend.profiles import PROFILES, ModelConfig, contract_for
from gateway.backend.profiles.base import Contract
from gateway.backend.profiles.custom import CustomContract, DeclaredTask
from gateway.backend.profiles.llmapi import LlmApiContract
from gateway.backend.profiles.trtllm import TrtllmContract
from gateway.backend.profiles.vllm import VllmContract
from gateway.serving import reasoning_parsers, tool_parsers
from gateway.serving.reasoning_parsers.base import ReasoningParser
from gateway.serving.tool_parsers.base import ToolParser

REPO = Path(__file__).resolve().parents[2] / "triton_repo"


def repository_configs() -> dict[str, ModelConfig]:
    """Every model config of ``triton_repo/``, as Triton's JSON."""
    configs = {}
    for path in sorted(REPO.glob("*/config.pbtxt")):
        message = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        data = json_format.MessageToDict(message, preserving_proto_field_name=True)
        configs[message.name] = ModelConfig.from_json(message.name, data)
    return configs


#: The profile each model of the repository is served by (triton_repo/README.md); None: a
#: step of an ensemble, which serves no OpenAI task.
EXPECTED = {
    "custom_stt": "custom",
    "custom_tts": "custom",
    "kokoro_ja": "custom",
    "e5_small": "custom",
    "piper_tts": "custom",
    "seed_llm": "custom",
    "whisper_base": "custom",
    "whisper_stt": "custom",
    "ensemble": "trtllm",
    "ensemble_vision": "trtllm",
    "tensorrt_llm_bls": "trtllm",
    "tensorrt_llm_bls_r24_08": "trtllm",
    "tensorrt_llm_bls_vision": "trtllm",
    "trtllm_llmapi": "llmapi",
    "trtllm_llmapi_sync": "llmapi",
    "mock_chat": "vllm",
    "mock_qwen3": "vllm",
    "mock_r1": "vllm",
    "smollm2": "vllm",
    "vllm_lora": "vllm",
    "vllm_r24_05": "vllm",
    "vllm_r24_12": "vllm",
    "vllm_r25_05": "vllm",
    "vllm_r25_11": "vllm",
    "vllm_r25_11_embed": "vllm",
    "vllm_vision": "vllm",
    "multimodal_encoders": None,
    "postprocessing": None,
    "preprocessing": None,
    "preprocessing_vision": None,
    "tensorrt_llm": None,
}


def test_the_documented_order_is_the_table() -> None:
    """custom (an operator's mapping) first, the backends, the declared-task fallback last."""
    assert [profile.__name__ for profile in PROFILES] == [
        "CustomContract",
        "LlmApiContract",
        "TrtllmContract",
        "VllmContract",
        "DeclaredTask",
    ]


def test_every_repository_model_gets_its_profile() -> None:
    configs = repository_configs()
    assert set(configs) == set(EXPECTED), "a model was added to triton_repo/: list it here"
    got = {}
    for name, config in configs.items():
        contract = contract_for(config, configs)
        got[name] = contract.profile if contract is not None else None
    assert got == EXPECTED


def test_a_vllm_model_that_declares_its_task_is_vllm_not_the_fallback() -> None:
    """Both rules match these configs: the backend's profile is tried first."""
    configs = repository_configs()
    for name in ("mock_chat", "smollm2", "vllm_r25_11_embed"):
        config = configs[name]
        assert VllmContract.matches(config, configs) and DeclaredTask.matches(config, configs)
        assert type(contract_for(config, configs)) is VllmContract


def test_an_operators_mapping_wins_over_the_backends_tensors() -> None:
    """A model with vLLM's inputs whose config maps its tensors is served by the mapping."""
    configs = repository_configs()
    data = json_format.MessageToDict(
        text_format.Parse(
            (REPO / "mock_chat" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        ),
        preserving_proto_field_name=True,
    )
    data["parameters"]["openai_input_prompt"] = {"string_value": "text_input"}
    config = ModelConfig.from_json("mapped", data)
    assert VllmContract.matches(config, configs)
    contract = contract_for(config, configs)
    assert type(contract) is CustomContract and contract.info().profile == "custom"


def test_the_backends_rules_do_not_overlap_on_their_own_configs() -> None:
    """PROFILES says the order among llmapi, trtllm and vllm is free because no config of
    theirs matches two of them; a new profile whose rule overlaps must choose its place."""
    configs = repository_configs()
    backends = (LlmApiContract, TrtllmContract, VllmContract)
    for name, config in configs.items():
        hits = [p.profile for p in backends if p.matches(config, configs)]
        assert len(hits) <= 1, (name, hits)


def defined_in(package: ModuleType, base: type) -> dict[str, list[type]]:
    """Each module of ``package`` (imported) and the subclasses of ``base`` it defines."""
    found: dict[str, list[type]] = {}
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        found[module_info.name] = [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, base) and cls is not base and cls.__module__ == module.__name__
        ]
    return found


def test_the_profile_table_holds_every_profile() -> None:
    found = defined_in(profiles, Contract)
    defined = {cls for classes in found.values() for cls in classes}
    assert defined == set(PROFILES)
    assert len(PROFILES) == len(set(PROFILES))
    # The modules that define no profile: the base and its helpers.
    assert {name for name, classes in found.items() if not classes} == {
        "base",
        "model_config",
        "text",
    }


# (package, base class, table, modules that hold no table entry, abstract or unnamed parsers)
PARSER_REGISTRIES: list[tuple[ModuleType, type, Any, set[str], set[str]]] = [
    (
        tool_parsers,
        ToolParser,
        tool_parsers.PARSERS,
        {"base", "call_reader", "forced"},  # forced: the calls the gateway forces, unnamed
        {"NamedCallParser", "CallArrayParser"},
    ),
    (
        reasoning_parsers,
        ReasoningParser,
        reasoning_parsers.PARSERS,
        {"base"},
        {"ThinkTags"},  # the shared reader of deepseek_r1 and qwen3
    ),
]


@pytest.mark.parametrize(
    ("package", "base", "table", "support", "unnamed"),
    PARSER_REGISTRIES,
    ids=["tool_parsers", "reasoning_parsers"],
)
def test_the_parser_table_holds_every_parser(
    package: ModuleType, base: type, table: Any, support: set[str], unnamed: set[str]
) -> None:
    found = defined_in(package, base)
    named = {cls for classes in found.values() for cls in classes if cls.__name__ not in unnamed}
    assert named == set(table.values()), "a parser module was added: name it in PARSERS"
    entries = set(table.values())
    assert {name for name, classes in found.items() if not entries & set(classes)} == support
    assert package.parser_names() == sorted(table)
    for name, parser in table.items():
        assert package.get_parser(name) is parser
    assert package.get_parser("no-such-format") is None
