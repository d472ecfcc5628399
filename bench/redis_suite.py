"""Redis's own Tcl test suite against redis-server and against ARCA: the share ARCA passes.

    .venv/bin/python bench/redis_suite.py --redis-src DIR [--units unit/expire,...]
        [--arca-port P] [--json out.json] [--failures]

DIR is a Redis source tree (its `tests/` directory) at the tag of the installed
redis-server (`redis-server --version`; 7.0.15 on Debian 12), for example
`git -C redis archive 7.0.15 tests | tar -x -C DIR`. Nothing is downloaded: the tool works on
that copy only. tclsh (Debian's `tcl`) runs the suite.

Each unit runs in Redis's external-server mode (`--host 127.0.0.1 --port P --singledb
--clients 1 --durable`) against a redis-server started here with its defaults (no
persistence, DEBUG disabled as packaged) and against an ARCA started here (or the one on
`--arca-port`), each on a free loopback port. The suite is copied to a temporary directory
and changed in two places there: the external-server preamble's `FUNCTION FLUSH` is allowed
to fail (ARCA has no scripting, and the preamble would abort every unit), and `test` records
each test's name and body so that the exclusion rule below can read them.

A test is in scope when redis-server passes it and neither its name nor its body names:
  - a command of another data type: lists, hashes, sets, sorted sets, streams, geo,
    HyperLogLog, SORT (COMMAND GETKEYS or COMMAND INFO of such a command included);
  - scripting (EVAL, EVALSHA, FCALL, FUNCTION, SCRIPT, lua-time-limit) or DEBUG;
  - what ARCA leaves out by design: pub/sub, replication (SYNC, WAIT, REPLICAOF,
    min-replicas-to-write, ...), cluster, MIGRATE, modules, and a database but 0 (SELECT,
    MOVE, SWAPDB, unless the test checks `$::singledb` itself);
  - the suite's helpers that use those (createComplexDataset, csvdump, debug_sleep,
    wait_for_ofs_sync, start_write_load, assert_replication_stream, debug_digest, ...).
In a body, words that are also Tcl (`lindex`, `lrange`, `eval`, ...) or plain English
(`wait`, `select`) count only as a command a client sends (`r eval`, `$rd wait`,
`r command getkeys lrange ...`) or as a quoted command name (`"eval"`, `"cluster|help"`). A test that redis-server fails or skips is not counted.
Out-of-scope tests are not run against ARCA at all (`--skipfile`), so one that fails there
cannot leave the shared client in a state (an open MULTI, say) that fails the next ones; a
name given to several tests of which one is out of scope skips them all (ARCA is then
counted as failing the others).

For every unit it prints the in-scope count, how many ARCA passes, and the share; then the
total, whether ARCA still answered PING after each unit (ARCA is restarted for the next
unit if not), and with `--failures` the in-scope tests ARCA failed. `--units` takes
unit names as runtest does (`unit/type/string`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from arca.launch import LaunchError, free_port, spawn_arca, stop, wait_for_pong  # noqa: E402  (after the checkout is on the path)

UNITS = ("unit/type/string", "unit/type/incr", "unit/expire", "unit/keyspace", "unit/protocol",
         "unit/info", "unit/info-command", "unit/quit", "unit/multi", "unit/scan",
         "unit/introspection-2")

OTHER_TYPES = (
    "lpush rpush lpushx rpushx lpop rpop llen lrem ltrim blpop brpop "
    "brpoplpush blmove lmove rpoplpush lpos lmpop blmpop "
    "hset hget hmset hmget hgetall hdel hexists hincrby hincrbyfloat hkeys hvals hlen hsetnx "
    "hstrlen hscan hrandfield "
    "sadd srem smembers sismember smismember scard spop srandmember smove sinter sinterstore "
    "sunion sunionstore sdiff sdiffstore sscan sintercard "
    "zadd zrem zrange zrangebyscore zrevrange zrevrangebyscore zscore zcard zincrby zrank zrevrank "
    "zcount zscan zpopmin zpopmax bzpopmin bzpopmax zunionstore zinterstore zrangestore zmpop "
    "bzmpop zrandmember zdiff zdiffstore zinter zunion zlexcount zrangebylex zrevrangebylex "
    "zremrangebyscore zremrangebyrank zremrangebylex zmscore "
    "xadd xrange xrevrange xlen xread xreadgroup xgroup xack xpending xclaim xautoclaim xtrim "
    "xdel xinfo xsetid "
    "geoadd geopos geodist georadius georadius_ro georadiusbymember geosearch geosearchstore "
    "geohash pfadd pfcount pfmerge pfdebug pfselftest sort sort_ro"
).split()
SCRIPTING_AND_DEBUG = "evalsha eval_ro evalsha_ro fcall fcall_ro debug".split()
HELPERS = ("min-replicas-to-write min-slaves-to-write repl-ping-replica-period lua-time-limit "
           "busy-reply-threshold createComplexDataset csvdump debug_sleep wait_for_ofs_sync "
           "start_write_load assert_replication_stream attach_to_replication_stream debug_digest "
           "debug_digest_value").split()
# Redis commands that are also Tcl commands or everyday words: in a body they count only as
# a command sent by a client (`r eval`, `$rd wait`, `r command getkeys lrange ...`).
CLIENT_ONLY = ("lindex lrange lset linsert eval function script subscribe psubscribe ssubscribe "
               "unsubscribe punsubscribe sunsubscribe publish spublish pubsub sync psync wait "
               "replicaof slaveof cluster module migrate").split()
# Another database: out of scope unless the test itself checks `$::singledb`.
OTHER_DATABASES = "select move swapdb".split()


def _client_command(words: list[str]) -> re.Pattern[str]:
    return re.compile(r"(?:(?<![\w\-])r|\$\w+|\[srv[^\]]*\]|getkeys|getkeysandflags)\s+(?:-?\d+\s+)?"
                      r"(%s)(?![\w\-])" % "|".join(words), re.IGNORECASE)


def _anywhere(words: list[str]) -> re.Pattern[str]:
    return re.compile(r"(?<![\w\-$])(%s)(?![\w\-])" % "|".join(words), re.IGNORECASE)


_BODY_WORDS = _anywhere(OTHER_TYPES + SCRIPTING_AND_DEBUG + HELPERS)
_BODY_CLIENT = _client_command(CLIENT_ONLY)
_BODY_DATABASES = _client_command(OTHER_DATABASES)
_NAME_WORDS = _anywhere(OTHER_TYPES + SCRIPTING_AND_DEBUG + CLIENT_ONLY)
# A command's name as a Tcl string, as in `lsearch $commands "script|kill"`.
_BODY_QUOTED = re.compile(r'"(%s)(?:\|[\w\-]*)?"' % "|".join(CLIENT_ONLY), re.IGNORECASE)


def excluded_by(name: str, body: str) -> str | None:
    """The word that puts a test out of scope, or None when it is in scope. A test's name is
    prose (`LMOVE command will not be marked with movablekeys`), so every listed command
    counts there; in its body Tcl's own words count only as a client's command."""
    found = (_NAME_WORDS.search(name) or _BODY_WORDS.search(body) or _BODY_CLIENT.search(body)
             or _BODY_QUOTED.search(body))
    if found is None and "$::singledb" not in body:
        found = _BODY_DATABASES.search(body)
    return found.group(1).lower() if found else None


RECORDER = r"""
# Added by bench/redis_suite.py: record every test's name and body for the exclusion rule.
rename test __suite_test
proc test {name code {okpattern undefined} {tags {}}} {
    if {[info exists ::env(SUITE_BODIES)]} {
        set f [open $::env(SUITE_BODIES) a]
        fconfigure $f -encoding utf-8
        puts -nonewline $f "[string length $name] [string length $code]\n$name$code"
        close $f
    }
    uplevel 1 [list __suite_test $name $code $okpattern $tags]
}
"""


def prepare_suite(source: Path, into: Path) -> Path:
    """A patched copy of the suite under `into`; its directory (where runtest is run)."""
    if not (source / "tests" / "test_helper.tcl").is_file():
        raise SystemExit(f"{source} has no tests/test_helper.tcl: pass a Redis source tree")
    suite = into / "redis"
    shutil.copytree(source / "tests", suite / "tests")
    server_tcl = suite / "tests" / "support" / "server.tcl"
    text = server_tcl.read_text()
    if "    r function flush\n" not in text:
        raise SystemExit(f"{server_tcl}: no external-server `r function flush` to relax (another Redis version?)")
    server_tcl.write_text(text.replace("    r function flush\n", "    catch {r function flush}\n", 1))
    with open(suite / "tests" / "support" / "test.tcl", "a", encoding="utf-8") as handle:
        handle.write(RECORDER)
    return suite


def read_bodies(path: Path) -> dict[str, list[str]]:
    """Test name -> the bodies recorded under that name (loops may give one name many)."""
    bodies: dict[str, list[str]] = {}
    if not path.exists():
        return bodies
    data = path.read_text(encoding="utf-8")
    at = 0
    while at < len(data):
        newline = data.index("\n", at)
        name_len, code_len = (int(n) for n in data[at:newline].split())
        name = data[newline + 1:newline + 1 + name_len]
        code = data[newline + 1 + name_len:newline + 1 + name_len + code_len]
        bodies.setdefault(name, []).append(code)
        at = newline + 1 + name_len + code_len
    return bodies


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OK = re.compile(r"^\[ok\]: (.*) \(\d+ ms\)$")
_ERR = re.compile(r"^\[err\]: (.*) in tests/\S+\.tcl$")


@dataclass
class UnitRun:
    passed: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    bodies: dict[str, list[str]] = field(default_factory=dict)
    other_errors: int = 0  # failures outside any test (a start_server block's set-up)
    alive: bool = True


def run_unit(suite: Path, unit: str, label: str, port: int, work: Path, timeout: int,
             logs: Path | None, skip: list[str]) -> UnitRun:
    """One unit against the server on `port`; `skip` names tests not to run at all."""
    stem = f"{label}-{unit.replace('/', '_')}"
    bodies = work / f"{stem}.bodies"
    bodies.unlink(missing_ok=True)
    command = ["tclsh", "tests/test_helper.tcl", "--host", "127.0.0.1", "--port", str(port),
               "--singledb", "--clients", "1", "--durable", "--timeout", str(timeout), "--single", unit]
    if skip:
        (work / f"{stem}.skip").write_text("".join(f"{name}\n" for name in skip))
        command += ["--skipfile", str(work / f"{stem}.skip")]
    env = {"PATH": "/usr/bin:/bin", "SUITE_BODIES": str(bodies)}
    try:
        done = subprocess.run(command, cwd=suite, env=env, capture_output=True, text=True,
                              errors="replace", timeout=timeout + 60)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) else (expired.stdout or "")
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{stem}.out").write_text(output)
    run = UnitRun(bodies=read_bodies(bodies))
    for line in output.splitlines():
        line = _ANSI.sub("", line).rstrip()
        if (ok := _OK.match(line)) is not None:
            run.passed[ok.group(1)] += 1
        elif (err := _ERR.match(line)) is not None:
            run.failed[err.group(1)] += 1
        elif line.startswith(("[err]:", "[exception]:")):
            run.other_errors += 1
    return run


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(directory: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(directory), "--daemonize", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_pong(port, proc)
    return proc, port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-src", type=Path, required=True, help="Redis source tree holding tests/")
    parser.add_argument("--units", default=",".join(UNITS))
    parser.add_argument("--arca-port", type=int, help="an ARCA already running on 127.0.0.1 (else one is started)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per unit")
    parser.add_argument("--json", type=Path, help="write the per-test outcome here")
    parser.add_argument("--failures", action="store_true", help="list the in-scope tests ARCA failed")
    parser.add_argument("--logs", type=Path, help="keep each run's runtest output in this directory")
    args = parser.parse_args(argv)
    units = [u for u in args.units.split(",") if u]

    with tempfile.TemporaryDirectory(prefix="redis-suite-") as tmp:
        work = Path(tmp)
        suite = prepare_suite(args.redis_src.resolve(), work)
        (work / "redis-data").mkdir()
        redis, redis_port = start_redis(work / "redis-data")
        arca: subprocess.Popen | None = None
        arca_port = args.arca_port

        def start_arca() -> int:
            nonlocal arca
            directory = Path(tempfile.mkdtemp(prefix="arca-", dir=work))
            arca, port = spawn_arca(directory, "--log-level", "warning")
            return port

        if arca_port is None:
            arca_port = start_arca()
        report = []
        try:
            for unit in units:
                theirs = run_unit(suite, unit, "redis", redis_port, work, args.timeout, args.logs, [])
                skip = sorted(name for name, bodies in theirs.bodies.items()
                              if "\n" not in name and any(excluded_by(name, body) for body in bodies))
                ours = run_unit(suite, unit, "arca", arca_port, work, args.timeout, args.logs, skip)
                ours.alive = answers_ping(arca_port)
                if not ours.alive and args.arca_port is None:
                    stop(arca)
                    try:
                        arca_port = start_arca()
                    except LaunchError as error:
                        print(f"ARCA did not restart: {error}", file=sys.stderr)
                        return 1
                report.append((unit, theirs, ours))
        finally:
            stop(redis)
            stop(arca)

    total_scope = total_ours = 0
    outcome: dict[str, list[dict]] = {}
    failures: list[str] = []
    print(f"{'unit':24} {'redis ok':>8} {'excluded':>8} {'in scope':>8} {'ARCA ok':>8} {'share':>7}  ARCA alive")
    for unit, theirs, ours in report:
        scope = ok = excluded = 0
        rows = outcome.setdefault(unit, [])
        for name, count in theirs.passed.items():
            bodies = theirs.bodies.get(name) or ours.bodies.get(name) or [""]
            reason = next((r for r in (excluded_by(name, body) for body in bodies) if r), None)
            passed = min(count, ours.passed.get(name, 0))
            rows.append({"test": name, "redis_passed": count, "arca_passed": passed, "excluded_by": reason})
            if reason is not None:
                excluded += count
                continue
            scope += count
            ok += passed
            if passed < count:
                failures.append(f"{unit}: {name}")
        total_scope += scope
        total_ours += ok
        share = f"{100 * ok / scope:6.1f}%" if scope else "     -"
        alive = "yes" if ours.alive else "NO (restarted)"
        extra = f" ({ours.other_errors} set-up errors)" if ours.other_errors else ""
        print(f"{unit:24} {sum(theirs.passed.values()):8} {excluded:8} {scope:8} {ok:8} {share:>7}  {alive}{extra}")
    share = 100 * total_ours / total_scope if total_scope else 0.0
    print(f"{'total':24} {'':8} {'':8} {total_scope:8} {total_ours:8} {share:6.1f}%")
    print(f"ARCA alive at the end: {'yes' if report and report[-1][2].alive else 'NO'}")
    if args.failures:
        print("\nin-scope tests ARCA failed:")
        print("\n".join(f"  {line}" for line in failures) or "  none")
    if args.json:
        args.json.write_text(json.dumps({"units": outcome, "in_scope": total_scope, "arca_passed": total_ours,
                                         "share": share}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
