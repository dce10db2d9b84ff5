"""The OpenAI Agents SDK's ``VoicePipeline`` as its users configure it for the gateway (an
agent on ``mock_chat``, ``whisper_stt`` hearing, ``piper_tts`` speaking), with what its
workflow was given to hear."""

from __future__ import annotations

from agents import Agent, OpenAIResponsesModel
from agents.voice import (
    OpenAIVoiceModelProvider,
    SingleAgentVoiceWorkflow,
    SingleAgentWorkflowCallbacks,
    VoicePipeline,
    VoicePipelineConfig,
)

from tests.support.stack import GatewayProcess


class Heard(SingleAgentWorkflowCallbacks):
    """Keeps what the workflow was given: the transcription of the spoken question."""

    def __init__(self) -> None:
        self.transcriptions: list[str] = []

    def on_run(self, workflow: SingleAgentVoiceWorkflow, transcription: str) -> None:
        self.transcriptions.append(transcription)


def voice_pipeline(stack: GatewayProcess, instructions: str) -> tuple[VoicePipeline, Heard]:
    """A voice pipeline as its users configure it for the gateway: an agent on
    ``mock_chat``, heard by ``whisper_stt`` and spoken by ``piper_tts``, and what its
    workflow was given."""
    agent = Agent(
        name="Assistant",
        instructions=instructions,
        model=OpenAIResponsesModel(model="mock_chat", openai_client=stack.async_client()),
    )
    heard = Heard()
    # A client of this pipeline's own: the SDK's default shares one HTTP client between
    # event loops, so a second test's request ran on a connection of the first's closed loop.
    provider = OpenAIVoiceModelProvider(openai_client=stack.async_client())
    pipeline = VoicePipeline(
        workflow=SingleAgentVoiceWorkflow(agent, callbacks=heard),
        stt_model="whisper_stt",
        tts_model="piper_tts",
        config=VoicePipelineConfig(model_provider=provider, tracing_disabled=True),
    )
    return pipeline, heard
