"""Internal API surface shared with TorchTPU (module names kept compatible)."""
