"""Terra inside AlpaSim: the world model served as AlpaSim's video-model renderer (``terra-alpasim``)."""
