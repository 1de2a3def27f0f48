"""Deployment: the image, the Kubernetes manifests, and `dask scheduler`/`dask worker` processes as the README starts them."""
