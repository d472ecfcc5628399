"""reame against llama.cpp's own server on a repetitive mixed workload, same kernels, same run.

    .venv/bin/python bench/versus_llama_server.py [--tokens 48] [--clients 4] [--no-build]

llama-server is built once from the llama.cpp that the installed llama-cpp-python vendors
(its sdist, unpacked under ~/.cache/reame-bench/llama-server/, the commands in
../shared/DESIGN.md); with --no-build, or when the build is impossible, the comparison is
skipped and the bench says so.

The workload (4 clients at once, greedy, /v1/completions, natural stops): classification
of reviews with one instruction, rewrites of a paragraph, questions over one long
document, and some exact repeats of earlier requests. Two passes: the second with new
review items and new questions over the same document, plus repeats of the first pass.
Servers: reame (a node with its defaults: L1, prefix cache, speculation, embedded
archive, fresh home), llama-server `-np 4` with its defaults, and llama-server `-np 4
--spec-type ngram-mod`. Reported per server: each pass's wall time and the total, tokens
generated; then reame against the better of the two llama-server configurations.
Greedy text is not compared across servers (near-ties differ between builds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.host import print_header  # noqa: E402
from bench.node_process import free_port, node_server, wait_healthy  # noqa: E402
from bench.offline_model import default_model  # noqa: E402
from bench.speculation import DOCUMENT, INSTRUCTION, PARAGRAPH, REVIEWS  # noqa: E402

CACHE = Path.home() / ".cache" / "reame-bench" / "llama-server"
LONG_DOCUMENT = "\n\n".join([PARAGRAPH, DOCUMENT, PARAGRAPH.replace("Vellmar", "Ostend")])
QUESTIONS = ("Who founded the guild of pilots?", "What is the total due on the invoice?",
             "When does the ferry leave in winter?", "What was the first quay made of?",
             "Which account must the invoice be paid to?", "What happened when the railway arrived?",
             "Who is the contact for the invoice?", "What did the town grow rich on?",
             "Where are the pilots' rules kept?", "How many boxes of yeast were ordered?",
             "What serves the harbour today?", "What date is the invoice?")


def workload(second: bool) -> list[str]:
    offset = 8 if second else 0
    reviews = [f"{INSTRUCTION}Review: {REVIEWS[(i + offset) % len(REVIEWS)]} (order {2000 + i + offset})\nSentiment:"
               for i in range(8)]
    rewrites = [f"Rewrite the following paragraph, keeping every sentence:\n\n{PARAGRAPH}\n\nRewritten:\n",
                f"Copy the invoice text exactly.\n\n{DOCUMENT}\n\nCopy:\n"]
    questions = [f"Document:\n{LONG_DOCUMENT}\n\nQuestion: {q}\nAnswer:"
                 for q in QUESTIONS[(6 if second else 0):(12 if second else 6)]]
    prompts = reviews + rewrites + questions
    if second:  # exact repeats of the first pass
        first = workload(False)
        prompts += [first[0], first[8], first[10]]
    return prompts


async def run_pass(url: str, prompts: list[str], tokens: int, clients: int) -> tuple[float, int]:
    limit = asyncio.Semaphore(clients)
    generated = 0

    async def one(session: aiohttp.ClientSession, prompt: str) -> None:
        nonlocal generated
        async with limit:
            body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0.0}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                data = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"{url}: HTTP {response.status}: {data}")
                generated += int(data["usage"]["completion_tokens"])

    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await asyncio.gather(*(one(session, p) for p in prompts))
    return time.perf_counter() - start, generated


def two_passes(url: str, tokens: int, clients: int) -> dict[str, float]:
    first, n1 = asyncio.run(run_pass(url, workload(False), tokens, clients))
    second, n2 = asyncio.run(run_pass(url, workload(True), tokens, clients))
    return {"first": first, "second": second, "total": first + second, "tokens": n1 + n2,
            "load": os.getloadavg()[0]}


def llama_server_binary(build: bool) -> Path | None:
    import llama_cpp

    version = llama_cpp.__version__
    source = CACHE / f"llama_cpp_python-{version}"
    binary = source / "vendor" / "llama.cpp" / "build" / "bin" / "llama-server"
    if binary.is_file() or not build:
        return binary if binary.is_file() else None
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"building llama-server {version} from the vendored llama.cpp (about 8 minutes, once) ...", flush=True)
    try:
        if not source.is_dir():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={version}", "-d", str(CACHE)], check=True)
            subprocess.run(["tar", "xzf", str(CACHE / f"llama_cpp_python-{version}.tar.gz"), "-C", str(CACHE)],
                           check=True)
        tree = source / "vendor" / "llama.cpp"
        subprocess.run(["cmake", "-B", "build", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF"], cwd=tree, check=True)
        subprocess.run(["cmake", "--build", "build", "--target", "llama-server", "-j2"], cwd=tree, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"llama-server could not be built ({exc}); its rows are skipped", flush=True)
        return None
    return binary if binary.is_file() else None


def with_llama_server(binary: Path, model: str, extra: list[str], tokens: int, clients: int) -> dict[str, float]:
    port = free_port()
    log_path = CACHE / f"server-{port}.log"
    log = open(log_path, "wb")
    process = subprocess.Popen([str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "4",
                                "-c", "8192", *extra], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, log_path)  # llama-server answers 503 while loading: urlopen raises
        return two_passes(url, tokens, clients)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def line(name: str, r: dict[str, float]) -> str:
    return (f"{name:38s} first {r['first']:7.1f} s  second {r['second']:7.1f} s  total {r['total']:7.1f} s  "
            f"{int(r['tokens']):5d} tokens  load {r['load']:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--model", default=None)
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args()
    print_header(getattr(args, 'model', None), threads=getattr(args, 'threads', None))
    model = args.model or str(default_model())
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    results: dict[str, dict[str, float]] = {}
    with node_server(model, ctx=8192, parallel=4, env={"REAME_CACHE_ENABLED": "true"}) as (url, _, _):
        results["reame (defaults)"] = two_passes(url, args.tokens, args.clients)
    print(line("reame (defaults)", results["reame (defaults)"]), flush=True)
    binary = llama_server_binary(not args.no_build)
    if binary is None:
        print("llama-server: not built (--no-build or the build failed); comparison skipped")
        return 0
    for name, extra in (("llama-server -np 4", []), ("llama-server -np 4 --spec-type ngram-mod",
                                                      ["--spec-type", "ngram-mod"])):
        results[name] = with_llama_server(binary, model, extra, args.tokens, args.clients)
        print(line(name, results[name]), flush=True)
    ours = results["reame (defaults)"]
    theirs = [r for name, r in results.items() if name.startswith("llama-server")]
    best_total = min(r["total"] for r in theirs)
    best_second = min(r["second"] for r in theirs)
    print(f"reame against the better llama-server: total {best_total / ours['total']:.2f}x faster, "
          f"second pass {best_second / ours['second']:.2f}x faster (targets >= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
