"""Control plane: metadata store, stream admin, chain manager."""
