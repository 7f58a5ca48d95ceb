"""Real client scripts' settings, offline and tiny, on tpu vs CPU."""
