# Checkpoint store tests, included whatever SHOAL_TEST_TIERS lists; each
# test carries its own tier label (unit, integration, e2e).
shoal_test(checkpoint_store_test unit ${CMAKE_CURRENT_LIST_DIR}/checkpoint_store_test.cc
  LIBS checkpoint_core)
shoal_test(checkpoint_service_test integration
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_service_test.cc
  LIBS checkpoint_service checkpoint_client)
shoal_test(checkpoint_e2e_test e2e ${CMAKE_CURRENT_LIST_DIR}/checkpoint_e2e_test.cc
  LIBS checkpoint_client shoalctl_checkpoints SERIAL)
add_dependencies(checkpoint_e2e_test shoal-checkpoint shoalctl)
# Links LibTorch through shoalctl_torch_export (no Torch header here).
shoal_test(checkpoints_cmd_test unit ${CMAKE_CURRENT_LIST_DIR}/checkpoints_cmd_test.cc
  LIBS shoalctl_checkpoints)
shoal_test(upload_grant_test integration ${CMAKE_CURRENT_LIST_DIR}/upload_grant_test.cc
  LIBS checkpoint_service checkpoint_client)
