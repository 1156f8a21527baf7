#!/bin/sh
# Pin the base image of every Dockerfile here by digest: PYTHON_IMAGE=python:X@sha256:...
# Needs network access to the registry (docker buildx). Run it before a release build, commit the
# result, and re-measure the worker image (its measurement changes with its base).
set -eu
cd "$(dirname "$0")"
image=$(sed -n 's/^ARG PYTHON_IMAGE=\([^@]*\).*/\1/p' Dockerfile.worker)
digest=$(docker buildx imagetools inspect "$image" --format '{{json .Manifest.Digest}}' | tr -d '"')
case "$digest" in sha256:*) ;; *) echo "no digest for $image" >&2; exit 1 ;; esac
for f in Dockerfile.gateway Dockerfile.broker Dockerfile.worker; do
  sed -i "s|^ARG PYTHON_IMAGE=.*|ARG PYTHON_IMAGE=$image@$digest|" "$f"
done
echo "pinned $image@$digest"
