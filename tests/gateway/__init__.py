"""The online gateway: its routes over real HTTP, the official clients, hostile requests, gateway processes."""
