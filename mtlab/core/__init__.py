"""The step core: accumulators, gradient transforms, the update (and its combination plug-ins), events,
history, the trainer's state I/O and the ``Trainer`` that conducts them."""
