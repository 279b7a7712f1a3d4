"""provisioners/gcp"""
