"""The simulated host's Mooncake: installed beside the simulated SGLang (tests/testhost binds it there), so a
[pd] apply's host facts find the transfer backend its units name. The simulated roles move no KV."""
