"""Two-box mode (prefill on one machine, decode on another): wire codec and handshake."""
