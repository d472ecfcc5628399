"""The output file of `reame batch` (node/cli/batch_output.py): what a rerun skips, a torn last
line cut off, one record per custom_id (the newest) in input order at the end."""

from __future__ import annotations

import orjson

from node.cli.batch_output import OutputFile


def record(custom_id: str, status: int = 200) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "response": {"status_code": status, "body": {}}}) + b"\n"


def test_reopen_skips_answered_ids_and_cuts_a_torn_line(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(record("b") + record("a", 503) + b'{"custom_id": "c", "respo')
    out = OutputFile(path)
    assert out.open() == {"b"}  # a failed line runs again; the torn one is gone
    assert path.read_bytes() == record("b") + record("a", 503)
    out.write(record("a"))
    out.write(record("c").rstrip(b"\n"))
    assert out.close(["a", "b", "c"]) == 3
    assert [orjson.loads(line)["custom_id"] for line in path.read_bytes().splitlines()] == ["a", "b", "c"]
    assert orjson.loads(path.read_bytes().splitlines()[0])["response"]["status_code"] == 200  # the newest


def test_a_new_file_and_ids_outside_the_input_last(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"
    out = OutputFile(path)
    assert out.open() == set()
    out.write(record("zz"))
    out.write(record("x"))
    assert out.close(["x"]) == 2
    assert [orjson.loads(line)["custom_id"] for line in path.read_bytes().splitlines()] == ["x", "zz"]
