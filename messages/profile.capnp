@0xa06817de25bdbe0e;
# Everything that outlives a process is a Cap'n Proto message: this is the planning profile file
# written by oobleck-profile and read by oobleck-plan (which also reads the JSON form).

$import "/capnp/c++.capnp".namespace("oobleck::messages::schema");

struct Profile {
  model @0 :Text;
  configHash @1 :Text;        # hash of the model config the profile was measured for
  deviceKind @2 :Text;        # "cpu", "cuda:NVIDIA H100 ...", ...
  microbatchSize @3 :UInt32;
  gpusPerNode @4 :UInt32;     # M, a power of two
  deviceMemoryBytes @5 :UInt64;
  layers @6 :List(Layer);
  link @7 :Link;              # between two nodes; absent (all zero) in profiles without it

  struct Link {
    latencyMs @0 :Float64;    # per message
    bytesPerMs @1 :Float64;   # 0: the bytes themselves cost nothing
  }

  struct Layer {
    name @0 :Text;
    forwardMs @1 :List(Float64);   # element i: stage width 2^i, for every width up to M
    backwardMs @2 :List(Float64);
    paramBytes @3 :UInt64;
    activationBytes @4 :UInt64;    # retained by autograd per in-flight microbatch
    outputBytes @5 :UInt64;        # the layer's output per microbatch (0 in older profiles)
    optimizerMs @6 :Float64;       # one AdamW step over its parameters (0 in older profiles)
  }
}
