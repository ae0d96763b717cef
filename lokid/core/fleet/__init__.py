"""Many servers, one endpoint (issue 30): the pure rules of a fleet of lokid hosts."""
