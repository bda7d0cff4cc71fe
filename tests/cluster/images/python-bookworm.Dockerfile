# The local stand-in for python:3.12-bookworm (a build image with a C toolchain), which cannot be
# pulled here: Debian bookworm's own Python (3.11) and pip, gcc, and the headers z2jh's hub
# requirements compile against (pycurl: libcurl; psycopg2: libpq).
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-dev python3-pip python3-venv python-is-python3 \
        build-essential libcurl4-openssl-dev libssl-dev libpq-dev \
 && rm -rf /var/lib/apt/lists/* /usr/lib/python3*/EXTERNALLY-MANAGED
