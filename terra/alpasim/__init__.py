"""Terra inside AlpaSim: the world model served as AlpaSim's video-model renderer (``terra-alpasim``).

``video_model.proto`` is AlpaSim's ``WorldModelService`` contract, compiled into ``video_model_pb2`` and
``video_model_pb2_grpc`` by scripts/tools/compile_alpasim_proto.py; ``poses.py`` turns AlpaSim's rig poses into Terra's
actions, ``sessions.py`` runs AlpaSim's rollouts as sessions of one engine, ``service.py`` answers the gRPC calls
and ``settings.py`` checks the server's settings (without torch). docs/alpasim.md says how to point AlpaSim's
runtime at it.
"""
