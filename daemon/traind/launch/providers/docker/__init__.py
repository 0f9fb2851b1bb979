"""A local Docker Engine as a job platform (``backend = "docker"``)."""
