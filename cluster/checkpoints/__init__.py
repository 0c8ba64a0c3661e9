"""Checkpoints of a job: where their data goes and how it is read back."""

from .storage import CheckpointStorage, CompletedCheckpoint, PendingCheckpoint, UnfinishedRunError

__all__ = ["CheckpointStorage", "CompletedCheckpoint", "PendingCheckpoint", "UnfinishedRunError"]
