# Offline checks of the deployment files (deploy/): no Docker engine, no
# cluster. They run the built binaries' --helpfull, so they need the build's
# bin directory; K8sManifests also needs kubectl (Debian's kubernetes-client,
# installed by scripts/install-deps.sh), both need python3-yaml and etcd
# (etcd-server: the members' flags are checked against `etcd --help`).
# The live check with Docker is `make test-deploy` (scripts/test-deploy.sh).
set(SHOAL_DEPLOY_PYTHON /usr/bin/python3 CACHE FILEPATH "Python 3 with python3-yaml for the deploy checks")
add_test(NAME K8sManifests
  COMMAND ${SHOAL_DEPLOY_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/validate_k8s.py
    --repo=${PROJECT_SOURCE_DIR} --bin_dir=${CMAKE_BINARY_DIR}/bin)
add_test(NAME ComposeFiles
  COMMAND ${SHOAL_DEPLOY_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/validate_compose.py
    --repo=${PROJECT_SOURCE_DIR} --bin_dir=${CMAKE_BINARY_DIR}/bin)
# The checks themselves: broken copies of deploy/ (one replica, readiness on
# the wrong name, an --etcd that misses a member, ...) must each fail.
add_test(NAME DeployChecksSelfTest
  COMMAND ${SHOAL_DEPLOY_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/deploy_checks_selftest.py
    --repo=${PROJECT_SOURCE_DIR} --bin_dir=${CMAKE_BINARY_DIR}/bin)
set_tests_properties(K8sManifests ComposeFiles DeployChecksSelfTest PROPERTIES LABELS unit TIMEOUT 300)
# The Grafana dashboard queries only metrics docs/OPERATIONS.md lists.
add_test(NAME GrafanaDashboard
  COMMAND ${SHOAL_DEPLOY_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/validate_dashboard.py
    --repo=${PROJECT_SOURCE_DIR})
set_tests_properties(GrafanaDashboard PROPERTIES LABELS unit TIMEOUT 60)
