# The local stand-in for quay.io/jupyterhub/configurable-http-proxy:5.2.0 (the proxy z2jh 4.4.0
# runs), which cannot be pulled here: CHP 5.2.0 and its dependencies from npm (the build context,
# tests/cluster/images.py:chp_context) on Debian's Node.js, as user nobody.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs \
 && rm -rf /var/lib/apt/lists/*
COPY chp /opt/chp
RUN ln -s /opt/chp/node_modules/configurable-http-proxy/bin/configurable-http-proxy /usr/local/bin/configurable-http-proxy
USER 65534
EXPOSE 8000
ENTRYPOINT ["configurable-http-proxy"]
