"""Speculative decoding: draft sources, the controller that decides draft lengths, statistics.

- source.py      the DraftSource protocol every source implements (per sequence, fast);
- lookup.py      prompt lookup: the longest suffix of prompt + output seen earlier in it
                 (and in its siblings' outputs), an index updated in O(1) per token;
- palimpsest.py  the local index of past generations of this model (fed by the node's own
                 finished sequences and by the archive mirror): a 3-gram hash index, not a
                 suffix tree, with draft lengths by match length;
- format.py      Il Suggeritore: tokens a grammar forces, and form rules (lists, tables,
                 indentation, closing brackets, repeated line prefixes), one source per rule;
- costs.py       the verify cost curve: seconds of a step by batch size and draft length;
- stats.py       per-source counters the controller, /metrics and /health read;
- controller.py  the engine's Speculator: asks the sources, chooses the draft length that
                 maximises tokens per second (0 when nothing pays), switches sources off
                 and re-probes them with backoff.

The engine (node/engine) knows only the Speculator hook and verifies what it is given;
nothing here runs llama.cpp or touches the network on the step path.
"""
