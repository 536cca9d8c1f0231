"""The simulated executor: the runtime's schedules and policies run against a clock, on a
max-min fair flow-level network, to predict a job on a cluster without running it."""
