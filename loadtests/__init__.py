"""Load tests: Locust scenario and user, perf_analyzer inputs and runners, the hybrid benchmark."""
