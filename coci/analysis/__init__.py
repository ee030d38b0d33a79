"""After the fact: replaying a plan under simulated failures and reporting a run's plan against
what happened."""
