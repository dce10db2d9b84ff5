"""smollm2's continuous batching (``triton_repo/llama_batching.py``) on the real SmolLM2
weights, in process: sequences decoded together must give each user exactly the answer it
gets alone, and one user leaving must not disturb the others."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "triton_repo"))
from llama_batching import BatchEngine, Sequence  # noqa: E402
from llama_sampling import TokenSampler  # noqa: E402

QUESTIONS = [
    "Write a poem about the sea.",
    "Tell me a story about a dragon.",
    "Explain how a bicycle works.",
    "Describe Paris to a tourist.",
]
STEPS = 12


class Reply:
    """Collects a sequence's tokens; ends it after ``limit`` tokens, or reports it cancelled
    once it has ``cancel_after`` tokens."""

    def __init__(self, log: list[str], name: str, limit: int, cancel_after: int | None) -> None:
        self.log, self.name = log, name
        self.limit, self.cancel_after = limit, cancel_after
        self.tokens: list[int] = []
        self.ended: str | None = None

    def token(self, token: int, logits: Any) -> bool:
        assert self.ended is None, f"{self.name} got a token after it ended"
        self.tokens.append(token)
        self.log.append(self.name)
        if len(self.tokens) < self.limit:
            return True
        self.ended = "length"
        return False

    def cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.tokens) >= self.cancel_after

    def cancel(self) -> None:
        self.ended = "cancelled"

    def fail(self, message: str) -> None:
        self.ended = message


@pytest.fixture(scope="module")
def engine(llm: Any) -> Iterator[BatchEngine]:
    # One thread: llama.cpp's threads wait for each other in spin loops, which on a busy
    # 2-core machine (a test stack beside) made this file ten times slower.
    engine = BatchEngine(llama_cpp, llm.model, slots=4, context_length=256, threads=1)
    yield engine
    engine.close()


def prompt(llm: Any, question: str) -> list[int]:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    tokens: list[int] = llm.tokenize(text.encode(), add_bos=True, special=True)
    return tokens


def greedy(llm: Any) -> TokenSampler:
    return TokenSampler(
        llama_cpp,
        llama_cpp.llama_model_get_vocab(llm.model),
        llm.n_vocab(),
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        seed=0,
    )


class Users:
    """Requests submitted to the engine, which the test steps by hand."""

    def __init__(self, llm: Any, engine: BatchEngine) -> None:
        self.llm, self.engine = llm, engine
        self.log: list[str] = []  # which reply got each token, in order

    def ask(
        self, question: str, name: str = "", limit: int = STEPS, cancel_after: int | None = None
    ) -> Reply:
        reply = Reply(self.log, name or question, limit, cancel_after)
        tokens, sampler = prompt(self.llm, question), greedy(self.llm)
        self.engine.submit(lambda: Sequence(tokens, sampler, reply))
        return reply

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.engine.step()

    def finish(self) -> None:
        self.engine.step()  # takes what was submitted
        while self.engine.busy:
            self.engine.step()


@pytest.fixture
def users(llm: Any, engine: BatchEngine) -> Users:
    return Users(llm, engine)


@pytest.fixture(scope="module")
def alone(llm: Any, engine: BatchEngine) -> dict[str, list[int]]:
    """Each question's greedy tokens when it is the only request."""
    answers = {}
    for question in QUESTIONS:
        users = Users(llm, engine)
        reply = users.ask(question)
        users.finish()
        answers[question] = reply.tokens
    assert all(len(tokens) == STEPS for tokens in answers.values())
    assert len({tuple(tokens) for tokens in answers.values()}) == len(QUESTIONS)
    return answers


def test_a_lone_answer_is_the_answer_smollm2_gave_before_batching(
    llm: Any, alone: dict[str, list[int]]
) -> None:
    # Before continuous batching, smollm2 decoded with Llama.eval in the Llama's own context.
    for question, tokens in alone.items():
        llm.reset()
        llm.eval(prompt(llm, question))
        sampler = greedy(llm)
        before = []
        for _ in range(STEPS):
            before.append(sampler.sample(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)))
            llm.eval([before[-1]])
        sampler.close()
        assert tokens == before, question


def test_four_users_together_get_the_answers_they_get_alone(
    users: Users, alone: dict[str, list[int]]
) -> None:
    replies = [users.ask(q) for q in QUESTIONS]
    users.finish()
    assert {r.name: r.tokens for r in replies} == alone
    # Decoded side by side: every user had a token before any user had its second.
    assert set(users.log[: len(QUESTIONS)]) == set(QUESTIONS)


def test_a_cancelled_user_stops_alone_and_its_slot_serves_the_next(
    users: Users, engine: BatchEngine, alone: dict[str, list[int]]
) -> None:
    leaver, *stayers = QUESTIONS
    gone = users.ask(leaver, cancel_after=5)
    kept = [users.ask(q) for q in stayers]
    users.step(8)
    assert gone.ended == "cancelled"
    assert gone.tokens == alone[leaver][:5]  # no token after the cancellation
    assert len(engine.free) == 1  # the only free slot is the cancelled one
    again = users.ask(leaver, name="again")  # joins while the others still decode
    users.finish()
    assert gone.tokens == alone[leaver][:5]
    assert [r.tokens for r in kept] == [alone[q] for q in stayers]
    assert all(r.ended == "length" for r in kept)
    assert again.tokens == alone[leaver]


def test_a_user_arriving_mid_generation_joins_the_running_batch(
    users: Users, alone: dict[str, list[int]]
) -> None:
    first, *late = QUESTIONS
    early = [users.ask(q) for q in late]
    users.step(6)
    newcomer = users.ask(first)
    users.finish()
    assert newcomer.tokens == alone[first]
    assert [r.tokens for r in early] == [alone[q] for q in late]
    # The newcomer's first token came while the others were still decoding, and they
    # went on decoding beside it (not after it).
    joined = users.log.index(first)
    assert set(users.log[joined:]) == set(QUESTIONS)
    assert users.log[-1] == first


def test_a_user_beyond_the_free_slots_waits_for_one_then_gets_its_answer(
    users: Users, alone: dict[str, list[int]]
) -> None:
    questions = [*QUESTIONS, QUESTIONS[0]]  # five users, four slots
    replies = [users.ask(q, name=f"user {i}") for i, q in enumerate(questions)]
    users.finish()
    assert [r.tokens for r in replies] == [alone[q] for q in questions]
    assert users.log.index("user 4") > users.log.index("user 0") + STEPS - 2
