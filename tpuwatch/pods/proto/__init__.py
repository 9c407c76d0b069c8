"""The kubelet's PodResources v1 API: messages and stubs generated from api.proto (see regenerate.sh)."""
