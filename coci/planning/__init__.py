"""Deciding when to checkpoint: the policy protocol, the failure models, the convergence fit, the
cost model and the planner that turns them into checkpoint steps."""
