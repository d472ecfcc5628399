"""The Batch API's machinery, without HTTP: OpenAI-style files and batches that survive restarts.

- store.py       SQLite (batches, files, per-line progress) beside the files on disk, on a
                 thread of its own, with byte budgets; output files written in input order;
- validation.py  every line of an input file checked before a batch starts;
- lines.py       what a line is, what running one returns, the executor Protocol the API
                 implements with its own parser and the service (so lines are answered
                 exactly like live requests, at batch priority);
- runner.py      runs the batches one after the other, lines in parallel up to a bound,
                 resuming after a restart without running a finished line twice.

Routes live in node/api/batch_routes.py; imports point down: api -> batches -> serving.
"""
