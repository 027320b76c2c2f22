// The structs behind the public opaque handles. Shared by the extern "C" shims in lib/api and the
// session code; nothing outside lib/ sees them.
#pragma once

#include <memory>
#include <string>

#include "coupling/coupler.h"
#include "plugin/objects.h"
#include "specinfer.h"

struct specinfer_coupler {
  std::unique_ptr<specinfer::Coupler> impl;
};

struct specinfer_target : specinfer::TargetObject {
  using TargetObject::TargetObject;
};

struct specinfer_drafter : specinfer::DrafterObject {
  using DrafterObject::DrafterObject;
};

struct specinfer_constraint : specinfer::ConstraintObject {
  using ConstraintObject::ConstraintObject;
};
