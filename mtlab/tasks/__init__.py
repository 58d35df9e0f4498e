"""Describing work: a task's model graph, its linked sets, sampling, and the one checked forward + loss."""
