// Command httpprobe is the health check of tokenscope's container images: it GETs a URL
// and exits 0 on a 2xx answer, 1 otherwise. The service images are distroless (no shell,
// no wget or curl), so the check ships as a static binary of its own.
//
//	httpprobe [-timeout 3s] http://127.0.0.1:9103/readyz
package main
