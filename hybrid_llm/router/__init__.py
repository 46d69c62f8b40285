"""The router (no Triton imports, nothing from engine/): policy, queues, breaker, relay, health, service."""
