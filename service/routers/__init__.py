"""One router per resource: generate, compare, runs, drafters, train, health."""
