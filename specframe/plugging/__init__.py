"""Plugging: discovering plugins through the `specframe` entry-point group, the component registry, component
options, and assembling a drafter, tree builder, verifier and backend into a checked pipeline."""
