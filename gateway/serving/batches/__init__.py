"""The Batch API (``/v1/batches``): :class:`BatchService` makes, reads, lists and cancels
batches; :class:`BatchWorker` (one per replica) runs their lines on the capacity
interactive requests leave. docs/batches.md has it all."""

from gateway.serving.batches.inprocess import BATCH_CALLER, BatchCaller
from gateway.serving.batches.service import BatchCreate, BatchService
from gateway.serving.batches.worker import BatchWorker

__all__ = ["BATCH_CALLER", "BatchCaller", "BatchCreate", "BatchService", "BatchWorker"]
