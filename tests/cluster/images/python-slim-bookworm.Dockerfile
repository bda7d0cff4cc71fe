# The local stand-in for python:3.12-slim-bookworm, which cannot be pulled here: Debian
# bookworm's own Python (3.11) and pip, installing into /usr/local as the python image's does.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 python3-pip python-is-python3 adduser \
 && rm -rf /var/lib/apt/lists/* /usr/lib/python3*/EXTERNALLY-MANAGED
