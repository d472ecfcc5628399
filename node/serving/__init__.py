"""The serving layer: what a request becomes and how it is answered, with no HTTP and no llama.cpp.

Request types (requests.py), typed failures (errors.py), the engine-client Protocol
(engine_client.py), prompts (template -> tokens), L1 keys and records (l1.py), the served
model's identity (model.py), settings (options.py). One direction: the service (service.py,
a thin face) wires the planner (planner.py: request -> plan, plan.py) and the jobs (jobs.py:
lookup, prefetch, submit, group submit, finish -> ledger and remember); answers (answer.py)
and the Conclave's events (conclave/events.py) take the jobs, never the service.
"""
