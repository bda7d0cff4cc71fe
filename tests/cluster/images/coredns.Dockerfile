# CoreDNS for the real node's cluster DNS: the binary tests/cluster/go/coredns builds (the build
# context is its folder in the cache), as CoreDNS's own image ships it, on nothing else.
FROM scratch
COPY coredns /coredns
USER 65532
EXPOSE 53 53/udp
ENTRYPOINT ["/coredns"]
