@0xb13be926063f1a93;
# A checkpoint's manifest (ARCHITECTURE.md §5 "Checkpoint"): what a checkpoint directory holds and how to
# check it. The directory holds one file per layer (the layer store's serialized bytes: parameters,
# AdamW moments and step count, behind the store's own checked header) and this manifest, written
# last, in a temporary directory that is renamed once everything is on disk.

$import "/capnp/c++.capnp".namespace("oobleck::messages::schema");

struct CheckpointManifest {
  formatVersion @0 :UInt32;   # runtime::checkpoint_format_version; another one is refused
  jobHash @1 :Text;           # the job's trajectory hash: model, data, training, optimizer
  step @2 :UInt64;            # the next step to run (steps 0..step-1 are in the layers)
  modelSeed @3 :UInt64;       # model.seed (initial weights), for humans: the hash covers it
  sampleSeed @4 :UInt64;      # training.seed (samples, dropout)
  numLayers @5 :UInt32;       # every layer 0..numLayers-1 has exactly one file
  files @6 :List(LayerFile);

  struct LayerFile {
    layer @0 :UInt32;
    name @1 :Text;            # file name inside the checkpoint directory
    bytes @2 :UInt64;
    sha256 @3 :Text;          # lowercase hex of the file's SHA-256
  }
}
