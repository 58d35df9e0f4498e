"""Bucketed minibatch streams now live in :mod:`mtlab.sampling` (a core concept); kept here as an alias."""

from ..tasks.sampling import BatchStream, ExampleSource, bucket_batches, lengths_of

__all__ = ["BatchStream", "ExampleSource", "bucket_batches", "lengths_of"]
