"""The shipped container images, built and run with Debian's podman and runc (``make images``).

``catalog`` names the three images and what bounds each (pure); ``podman`` is the thin adapter
over the podman command line, with the options this kind of machine needs; ``base`` makes the
base image with debootstrap where the Dockerfiles' default cannot be pulled; ``build`` builds
the images on it and reports their sizes and build times.
"""
