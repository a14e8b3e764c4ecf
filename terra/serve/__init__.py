"""``terra-serve``: closed-loop sessions over HTTP and WebSocket, and a page to drive them."""
