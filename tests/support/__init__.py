"""What the test modules share: stand-in backends and servers, builders of specs, fleets
and model files, ``rosterd up`` run as a user runs it, and the benches that drive the pure
machines. No tests here; a test module imports from this package, never from another test
module."""
