"""The serving layer: what a request becomes and how it is answered, with no HTTP and no llama.cpp.

Request types (requests.py), typed failures (errors.py), the engine-client Protocol
(engine_client.py), prompts (template -> tokens), L1 keys and records (l1.py), the served
model's identity (model.py), plans and their answers (plan.py, answer.py), the service that
orchestrates archive lookup -> engine -> archive fill (service.py) and its metrics.
"""
